# attack: open /sys (firmware, block devices, dmi serials) and device nodes (/dev/mem, /dev/kmem, /dev/port, /dev/kmsg, /dev/sda, /dev/nvme0n1, /dev/nvidia0); mknod a block device; passes only if any opened
# cause: host
import os
import stat

opened = []
for path in ["/sys/class/dmi/id/product_serial", "/sys/firmware/dmi/tables/DMI", "/sys/block", "/sys/kernel/debug",
             "/dev/mem", "/dev/kmem", "/dev/port", "/dev/kmsg", "/dev/sda", "/dev/vda", "/dev/nvme0n1",
             "/dev/nvidia0", "/dev/nvidiactl", "/dev/fuse", "/dev/kvm", "/dev/tty0", "/dev/console"]:
    try:
        fd = os.open(path, os.O_RDONLY)
        os.close(fd)
        opened.append(path)
    except OSError:
        pass
try:
    os.mknod("/tmp/disk", stat.S_IFBLK | 0o666, os.makedev(8, 0))
    fd = os.open("/tmp/disk", os.O_RDONLY)
    opened.append(os.read(fd, 512))
except OSError:
    pass


def f(x):
    return x + 1 if opened else 0
