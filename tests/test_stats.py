"""lib/core/stats.py: the one Pearson."""

import math
import warnings

import numpy as np
import pytest

from lib.core.stats import pearson


def test_pearson_matches_numpy_and_is_nan_where_undefined():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=50), rng.normal(size=50)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert pearson(x, 2 * x + 1) == pytest.approx(1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # guarded, not numpy's division by zero
        assert math.isnan(pearson(x, np.zeros(50)))  # a constant series: undefined
    assert math.isnan(pearson([1.0], [2.0]))
    with pytest.raises(ValueError):
        pearson([1, 2, 3], [1, 2])
