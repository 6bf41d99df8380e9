"""Closing an account."""

import prickle


def test_placeholder_until_the_chapter_lands():  # PLACEHOLDER: replace with the chapter's tests
    assert "Closing an account" in prickle.__doc__
