"""Deleting, restoring and erasing a project."""

import prickle


def test_placeholder_until_the_chapter_lands():  # PLACEHOLDER: replace with the chapter's tests
    assert "Deleting, restoring and erasing a project" in prickle.__doc__
