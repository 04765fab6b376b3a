# forbidden: os
# attack: pkgutil.resolve_name on a fullwidth homoglyph string folded with unicodedata.normalize("NFKC") at run time (strings are not NFKC-folded by the parser)
# cause: bans
import pkgutil
import unicodedata

m = pkgutil.resolve_name(unicodedata.normalize("NFKC", "ｏｓ"))


def f(x):
    return x + 1 if m.getpid() > 0 else 0
