"""Mean, standard deviation and z-scores in pure Python: the example project's one requirement."""

import math

__version__ = "0.1.0"


def mean(values):
    values = list(values)
    return sum(values) / len(values)


def stdev(values):
    values = list(values)
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values)) or 1.0


def zscores(values):
    """The values shifted to mean 0 and scaled to standard deviation 1, with the (mean, stdev)
    to undo it."""
    values = list(values)
    m, s = mean(values), stdev(values)
    return [(v - m) / s for v in values], (m, s)
