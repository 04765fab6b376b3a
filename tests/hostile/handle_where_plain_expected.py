# attack: answer the tests' lookup with a handle where a kind list is expected and each call with a handle claiming type "int" and truth True, and with the built-in type object, hoping one compares equal
# cause: verdict
import os
import sys

main = sys.modules["__main__"]
calls = []


def answer(fd, message, handles):
    if "value" in message:
        calls.append(1)
        body = ('["value",' + ('{"h":[0,"int",true]}' if len(calls) == 1 else '{"type":"int"}') + ',["d",1]]')
    elif "names" in message:
        body = '["names","f","callable",[1],"g",{"h":[0,"list",true]},["d",2],["d",1]]'
    else:
        return real(fd, message, handles)
    data = body.encode()
    os.write(fd, len(data).to_bytes(8, "big") + data)


real = main._answer
main._answer = answer


def f(x):
    return 0
