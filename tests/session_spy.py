"""Spies on the sessions a decoder opens: a test sees what each request was seeded with and
what it drafted, while the real session does the work."""

import numpy as np


class SessionSpy:
    """Forwards everything to the real session; records seed rows, drafted trees, their
    deepest depth and the history they were drafted from."""

    def __init__(self, inner, log):
        self._inner, self._log = inner, log

    def seed(self, ids, probs, start=0):
        self._log.seeded.append(np.array(ids))
        self._log.starts.append(start)
        return self._inner.seed(ids, probs, start)

    def propose_into(self, tokens, *args):
        return self._record(tokens, *self._inner.propose_into(tokens, *args))

    def cut_into(self, nodes, tokens, *args):
        return self._record(tokens, *self._inner.cut_into(nodes, tokens, *args))

    def _record(self, tokens, n, deepest):
        self._log.trees.append(tokens[:n].copy())
        self._log.depths.append(deepest)
        self._log.histories.append(len(self._inner.history))
        return n, deepest

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._inner.__exit__(*exc)

    def __getattr__(self, name):
        return getattr(self._inner, name)


class DrafterSpy:
    """Stands in for a decoder's shared drafter: every session it opens is a `SessionSpy`."""

    def __init__(self, inner):
        self._inner, self.seeded, self.trees, self.starts = inner, [], [], []
        self.depths, self.histories = [], []

    def session(self, **kwargs):
        return SessionSpy(self._inner.session(**kwargs), self)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    @staticmethod
    def install(dec) -> "DrafterSpy":
        dec._drafter = spy = DrafterSpy(dec._drafter)
        return spy
