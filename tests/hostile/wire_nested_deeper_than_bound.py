# attack: answer every call with a wire frame nested far deeper than the bound: two hundred thousand list operations over one value, then JSON brackets nested a million deep, hoping the comparing side recurses until it crashes instead of refusing the value
# cause: verdict
import os
import sys

main = sys.modules["__main__"]
calls = []


def answer(fd, message, handles):
    if "value" not in message:
        return real(fd, message, handles)
    if len(calls) % 2 == 0:
        body = ('["value",0' + ",[1]" * 200_000 + ',["d",1]]').encode()
    else:
        body = ('["value",' + "[" * 1_000_000 + "]" * 1_000_000 + ',["d",1]]').encode()
    calls.append(1)
    os.write(fd, len(body).to_bytes(8, "big") + body)


real = main._answer
main._answer = answer


def f(x):
    return 0
