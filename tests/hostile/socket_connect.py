# attack: open a socket to the test's listener or the internet; passes only if it connects
# cause: bans
import socket

ok = False
for address in [("127.0.0.1", {PORT}), ("1.1.1.1", 53), ("8.8.8.8", 53)]:
    try:
        socket.create_connection(address, timeout=0.5).close()
        ok = True
    except OSError:
        pass


def f(x):
    return x + 1 if ok else 0
