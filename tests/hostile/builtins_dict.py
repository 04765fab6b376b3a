# forbidden: exec
# attack: a forbidden builtin through the builtins dict and a joined string
# cause: bans
import builtins

run = builtins.__dict__["".join(["ex", "ec"])]
ns = {}
run("def f(x):\n    return x + 1", ns)
f = ns["f"]
