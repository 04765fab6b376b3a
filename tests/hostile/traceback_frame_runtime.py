# attack: the harness's frames through a traceback, with the attribute name computed at run time
# cause: verdict
import os


def f(x):
    try:
        1 / 0
    except ZeroDivisionError as e:
        frame = getattr(e.__traceback__, "tb_" + chr(102) + "rame")
    back = "f_" + chr(98) + "ack"
    while frame is not None:
        names = getattr(frame, "f_" + chr(108) + "ocals")
        if "nonce" in names:
            for i in range(4):
                os.write(names["fd"], names["nonce"] + b" pass %d\n" % i)
        frame = getattr(frame, back)
    return 0
