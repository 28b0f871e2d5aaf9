"""A NumPy stand-in for the few torch calls builders/kvlab/cuda.py makes, with torch's meaning (transpose swaps
two dimensions; `.to(dtype)` converts), so its read paths can be checked where PyTorch and a GPU are absent."""

# mypy: ignore-errors
# ruff: noqa
import numpy as np

float16 = np.float16
__version__ = "shim"


class T(np.ndarray):
    def to(self, *a, **k):
        dt = [x for x in a if isinstance(x, type)]
        return self.astype(dt[0]).view(T) if dt else self

    def float(self):
        return self.astype(np.float32).view(T)

    def repeat_interleave(self, n, dim):
        return np.repeat(self, n, axis=dim).view(T)

    def masked_fill(self, mask, val):
        return np.where(mask, val, self).view(T)

    def cpu(self):
        return self

    def transpose(self, a, b):
        return np.swapaxes(self, a, b).view(T)

    def numpy(self):
        return np.asarray(self)


def from_numpy(a):
    return np.asarray(a).view(T)


def as_tensor(a, device=None):
    return np.asarray(a).view(T)


def arange(*a, device=None):
    return np.arange(*a).view(T)


def einsum(s, *ops):
    return np.einsum(s, *ops).view(T)


def logsumexp(x, dim):
    m = np.max(x, axis=dim, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    return (np.log(np.sum(np.exp(x - m), axis=dim)) + np.squeeze(m, dim)).view(T)


exp = lambda x: np.exp(x).view(T)
where = lambda c, a, b: np.where(c, a, b).view(T)
isfinite = np.isfinite
maximum = lambda a, b: np.maximum(a, b).view(T)
cat = lambda xs: np.concatenate(xs).view(T)


def empty(shape, dtype=None, device=None):
    return np.full(shape, np.nan, dtype=dtype).view(T)


class cuda:
    @staticmethod
    def is_available():
        return True

    @staticmethod
    def synchronize():
        pass

    class Event:
        def __init__(self, enable_timing=False):
            pass

        def record(self):
            import time

            self.t = time.perf_counter()

        def elapsed_time(self, other):
            return (other.t - self.t) * 1000
