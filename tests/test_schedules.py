"""Private rooms: schedules."""

import prickle


def test_placeholder_until_the_chapter_lands():  # PLACEHOLDER: replace with the chapter's tests
    assert "Private rooms: schedules" in prickle.__doc__
