import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from traintop.stats import median


@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12), min_size=1))
def test_median_is_the_statistics_modules(values):
    assert median(values) == statistics.median(values)


def test_median_of_nothing_is_an_error():
    with pytest.raises(ValueError):
        median([])
