# attack: sockets of every family but AF_UNIX: AF_INET to the host's listener and the internet, AF_INET6 loopback, raw AF_PACKET, AF_NETLINK route dump; passes only if any was created
# cause: bans
import socket

made = []
for family, kind, proto, address in [
        (socket.AF_INET, socket.SOCK_STREAM, 0, ("127.0.0.1", {PORT})),
        (socket.AF_INET, socket.SOCK_DGRAM, 0, ("8.8.8.8", 53)),
        (socket.AF_INET6, socket.SOCK_STREAM, 0, ("::1", {PORT})),
        (getattr(socket, "AF_PACKET", 17), socket.SOCK_RAW, 0x0300, None),
        (getattr(socket, "AF_NETLINK", 16), socket.SOCK_RAW, 0, None),
        (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP, None)]:
    try:
        s = socket.socket(family, kind, proto)
        made.append(family)
        if address:
            s.settimeout(0.5)
            s.connect(address)
    except OSError:
        pass


def f(x):
    return x + 1 if made else 0
