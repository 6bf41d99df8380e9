"""Exporting a project."""

import prickle


def test_placeholder_until_the_chapter_lands():  # PLACEHOLDER: replace with the chapter's tests
    assert "Exporting a project" in prickle.__doc__
