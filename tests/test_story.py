"""The project story."""

import prickle


def test_placeholder_until_the_chapter_lands():  # PLACEHOLDER: replace with the chapter's tests
    assert "The project story" in prickle.__doc__
