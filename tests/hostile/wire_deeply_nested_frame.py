# attack: answer f with a hand-made frame nested 100,000 lists deep (and a length prefix of 2**63 on the next call), to crash or stall the decoder on the comparing side
# cause: verdict
import sys

main = sys.modules["__main__"]
calls = []


def answer(fd, message, handles):
    import os

    if "value" not in message:
        return real(fd, message, handles)
    calls.append(1)
    if len(calls) == 1:
        body = b"[" * 100000 + b"]" * 100000
        os.write(fd, len(body).to_bytes(8, "big") + body)
    else:
        os.write(fd, (2**63).to_bytes(8, "big") + b"{}")


real = main._answer
main._answer = answer


def f(x):
    return 0
