""" The one Markdown table formatter (sa_vision.tables) against tables written by hand """
import pytest

from sa_vision.tables import markdown_table


def test_plain_table_with_right_aligned_numbers():
    assert markdown_table(['model', 'top-1 %'], [['`a`', '89.30'], ['`bc`', 9]], 'lr') == (
        '| model | top-1 % |\n'
        '|----|---:|\n'
        '| `a` | 89.30 |\n'
        '| `bc` | 9 |')


def test_padded_table_lines_up_in_a_terminal():
    assert markdown_table(['n', 'name'], [[1, 'x'], [22, 'long']], 'rl', pad=True) == (
        '|  n | name |\n'
        '|---:|------|\n'
        '|  1 | x    |\n'
        '| 22 | long |')


def test_a_row_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match='2 cells'):
        markdown_table(['a', 'b'], [['only one']])
