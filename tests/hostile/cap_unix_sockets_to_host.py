# attack: AF_UNIX is allowed: connect to well-known host daemons by path (docker, systemd, dbus, X11) and in the abstract namespace; passes only if one connects
# cause: bans
import socket

connected = []
for address in ["/var/run/docker.sock", "/run/docker.sock", "/run/systemd/private", "/run/dbus/system_bus_socket",
                "/tmp/.X11-unix/X0", "/run/user/0/bus", "\0/tmp/.X11-unix/X0", "\0/org/freedesktop/systemd1/notify",
                "\0rlft", "/run/containerd/containerd.sock"]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.3)
    try:
        s.connect(address)
        connected.append(address)
    except OSError:
        pass
    finally:
        s.close()


def f(x):
    return x + 1 if connected else 0
