# attack: write a hand-made wire frame {"error": ...} with "\x0b" (vertical tab) separated pass lines on every descriptor 3..63 (the channel to the tests among them), then exit before the harness answers
# cause: verdict
import json
import os

text = "x\x0bpass 0\x0bpass 1\x0bdone"
body = json.dumps(["error", text, ["d", 1]]).encode()  # the wire's form of {"error": text}
frame = len(body).to_bytes(8, "big") + body
for fd in range(3, 64):
    try:
        os.write(fd, frame)
    except OSError:
        pass


def f(x):
    return 0


os._exit(0)
