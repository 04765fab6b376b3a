# forbidden: os
# attack: a fullwidth homoglyph of a forbidden module (Python folds identifiers with NFKC)
# cause: bans
import ｏｓ

ok = ｏｓ.getpid() > 0


def f(x):
    return x + 1 if ok else 0
