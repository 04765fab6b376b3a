# attack: read files only root may read; passes only if one is readable
# cause: host
ok = False
for path in ["/etc/shadow", "{CANARY}", "/root/.bashrc", "/root/.profile"]:
    try:
        with open(path) as fh:
            fh.read()
        ok = True
    except OSError:
        pass


def f(x):
    return x + 1 if ok else 0
