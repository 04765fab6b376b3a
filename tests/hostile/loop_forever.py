# attack: a busy loop that never ends (wall clock and RLIMIT_CPU)
# cause: resources
while True:
    pass
