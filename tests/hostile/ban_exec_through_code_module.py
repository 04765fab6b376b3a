# forbidden: os, exec, eval
# attack: run a source string with code.InteractiveInterpreter().runsource (no exec/eval/compile named); the source builds the forbidden name from bytes
# cause: bans
import code

env = {"result": []}
code.InteractiveInterpreter(env).runsource("result.append(__import__(bytes([111, 115]).decode()).getpid())")
found = env["result"]


def f(x):
    return x + 1 if found else 0
