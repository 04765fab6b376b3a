# attack: answer with wire values the decoder does not expect to fail: a Fraction with denominator 0, an invalid Decimal, a 100,000-hex-digit integer, a NaN float (decode errors outside WireError)
# cause: verdict
import os
import sys

main = sys.modules["__main__"]
values = ['{"fr":["0x1","0x0"]}', '{"dec":"not-a-number"}', '{"i":"0x' + "f" * 99990 + '"}', '{"f":"nan"}']
calls = []


def answer(fd, message, handles):
    if "value" not in message:
        return real(fd, message, handles)
    body = ('["value",' + values[len(calls) % len(values)] + ',["d",1]]').encode()
    calls.append(1)
    os.write(fd, len(body).to_bytes(8, "big") + body)


real = main._answer
main._answer = answer


def f(x):
    return 0
