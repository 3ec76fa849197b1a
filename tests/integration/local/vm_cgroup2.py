"""Boot Debian's own kernel under qemu (software emulation, TCG) with the
unified cgroup hierarchy, and run a command of this machine inside it.

Used by test_cgroup2.py: this build machine mounts cgroup v1, so the local
provider's cgroup v2 path can only be exercised in a VM. No KVM is needed.

  * The kernel is package linux-image-amd64's dependency (linux-image-X-amd64),
    fetched with `apt-get download` and unpacked with `dpkg-deb -x` into a
    cache directory (OSR_VM_CACHE, default /var/tmp/osr-vm-cache). Nothing is
    installed on the host.
  * The initramfs is built here: busybox (package busybox-static), the
    virtio-pci / 9p / overlay modules with their dependencies (read from each
    module's .modinfo section: the host has no depmod output for them), and
    an /init script.
  * The guest's root is this machine's / over virtio-9p, read-only, under an
    overlayfs whose upper layer is a tmpfs; cgroup2 is mounted at
    /sys/fs/cgroup. A second, writable 9p share (a host temporary directory)
    carries the command to run in and its output, exit status and results
    out. No network device.
  * qemu runs with -no-reboot and the kernel with panic=-1, under a hard
    timeout: whatever happens in the guest, qemu exits.
"""
import fcntl
import glob
import os
import shutil
import subprocess
import tempfile

CACHE = os.environ.get("OSR_VM_CACHE", "/var/tmp/osr-vm-cache")
QEMU = "qemu-system-x86_64"
BUSYBOX = "/bin/busybox"
# What the initramfs loads (and, through .modinfo "depends=", what they need).
MODULES = ["virtio_pci", "9pnet_virtio", "9p", "overlay"]


def problem():
    """Why the VM cannot run here (a reason to skip), or None."""
    if os.geteuid() != 0:
        return "the cgroup v2 VM test needs root (the local provider does)"
    if shutil.which(QEMU) is None:
        return "%s is not installed (package qemu-system-x86)" % QEMU
    if not os.path.exists(BUSYBOX):
        return "busybox is not installed (package busybox-static)"
    for tool in ("apt-get", "apt-cache", "dpkg-deb"):
        if shutil.which(tool) is None:
            return "%s is missing" % tool
    return None


def kernel_package():
    """linux-image-amd64's versioned dependency, e.g. linux-image-6.1.0-57-amd64."""
    out = subprocess.run(["apt-cache", "depends", "linux-image-amd64"], capture_output=True,
                         text=True, timeout=120, check=True).stdout
    for line in out.splitlines():
        w = line.split()
        if len(w) == 2 and w[0] == "Depends:" and w[1].startswith("linux-image-"):
            return w[1]
    raise RuntimeError("apt-cache knows no linux-image-amd64 (run apt-get update)")


def fetch_kernel():
    """(vmlinuz path, modules directory) of the cached kernel, fetching it
    once. A lock file serialises concurrent test runs."""
    os.makedirs(CACHE, exist_ok=True)
    with open(os.path.join(CACHE, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        pkg = kernel_package()
        root = os.path.join(CACHE, pkg)
        if not glob.glob(os.path.join(root, "boot", "vmlinuz-*")):
            dl = tempfile.mkdtemp(dir=CACHE)
            try:
                # _apt cannot write into root's directory: download unsandboxed.
                subprocess.run(["apt-get", "download", "-o", "APT::Sandbox::User=root", pkg],
                               cwd=dl, check=True, capture_output=True, timeout=900)
                deb = glob.glob(os.path.join(dl, "*.deb"))[0]
                tmp = root + ".part"
                shutil.rmtree(tmp, ignore_errors=True)
                subprocess.run(["dpkg-deb", "-x", deb, tmp], check=True, timeout=900)
                os.rename(tmp, root)
                # Keep only the current kernel (each is ~400 MB unpacked).
                for old in glob.glob(os.path.join(CACHE, "linux-image-*")):
                    if old != root:
                        shutil.rmtree(old, ignore_errors=True)
            finally:
                shutil.rmtree(dl, ignore_errors=True)
        vmlinuz = glob.glob(os.path.join(root, "boot", "vmlinuz-*"))[0]
        mods = glob.glob(os.path.join(root, "lib", "modules", "*"))[0]
        return vmlinuz, mods


def modinfo_depends(path):
    with open(path, "rb") as f:
        data = f.read()
    i = data.find(b"\0depends=")
    if i < 0:
        return []
    end = data.index(b"\0", i + 1)
    deps = data[i + len(b"\0depends="):end].decode()
    return [d for d in deps.split(",") if d]


def module_order(moddir, wanted):
    """Module files in load order (dependencies first)."""
    where = {}
    for dirpath, _, files in os.walk(moddir):
        for f in files:
            if f.endswith(".ko"):
                where[f[:-3].replace("-", "_")] = os.path.join(dirpath, f)
    order, seen = [], set()

    def visit(name):
        name = name.replace("-", "_")
        if name in seen:
            return
        seen.add(name)
        if name not in where:
            raise RuntimeError("module %s is not in %s (built in?)" % (name, moddir))
        for d in modinfo_depends(where[name]):
            visit(d)
        order.append(where[name])

    for w in wanted:
        visit(w)
    return order


def cpio_newc(entries):
    """A newc cpio archive of (name, mode, data) entries (data None = dir)."""
    out = bytearray()
    for ino, (name, mode, data) in enumerate(entries + [("TRAILER!!!", 0, b"")], 1):
        data = data or b""
        nb = name.encode() + b"\0"
        hdr = "070701" + "".join("%08X" % v for v in (
            ino, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(nb), 0))
        out += hdr.encode() + nb
        out += b"\0" * (-len(out) % 4)
        out += data
        out += b"\0" * (-len(out) % 4)
    return bytes(out)


INIT = r"""#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /lower /upper /newroot
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in $(cat /modules.order); do insmod "$m" || echo "osr-vm: insmod $m failed"; done
fail() { echo "osr-vm: $*"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 hostroot /lower || fail "9p root"
mount -t tmpfs -o size=512m tmpfs /upper || fail tmpfs
mkdir -p /upper/u /upper/w
mount -t overlay -o lowerdir=/lower,upperdir=/upper/u,workdir=/upper/w overlay /newroot \
  || fail overlay
mkdir -p /newroot/osr-vm
cp /bin/busybox /newroot/osr-vm/busybox
cp /stage2 /newroot/osr-vm/stage2
umount /proc /sys /dev
exec switch_root /newroot /osr-vm/busybox sh /osr-vm/stage2
"""

# PID 1 in the new root (this machine's file system): fresh /proc, /sys,
# /dev and /run (not /tmp: a checkout under /tmp must stay visible, and the
# overlay's tmpfs upper layer already keeps the guest's writes there off
# the host), cgroup2 at /sys/fs/cgroup, the out share, then the
# command the host left there; its output and status go back to the share.
STAGE2 = r"""B=/osr-vm/busybox
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
$B mount -t devtmpfs dev /dev
$B mkdir -p /dev/pts /dev/shm
$B mount -t devpts devpts /dev/pts
$B mount -t tmpfs tmpfs /dev/shm
$B mount -t tmpfs tmpfs /run
$B mount -t cgroup2 cgroup2 /sys/fs/cgroup
$B mkdir -p /osr-vm/out
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 osrout /osr-vm/out
$B hostname osr-vm
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
echo "osr-vm: running the command"
/bin/sh /osr-vm/out/cmd.sh > /osr-vm/out/output 2>&1
echo $? > /osr-vm/out/status
$B sync
echo "osr-vm: done"
$B poweroff -f
"""


def slurp(path):
    with open(path, "rb") as f:
        return f.read()


def build_initramfs(moddir, path):
    entries = [("bin", 0o40755, None), ("bin/busybox", 0o100755, slurp(BUSYBOX)),
               ("lib", 0o40755, None), ("lib/mod", 0o40755, None)]
    order = []
    for i, m in enumerate(module_order(moddir, MODULES)):
        name = "lib/mod/%02d-%s" % (i, os.path.basename(m))
        entries.append((name, 0o100644, slurp(m)))
        order.append("/" + name)
    entries += [("modules.order", 0o100644, ("\n".join(order) + "\n").encode()),
                ("init", 0o100755, INIT.encode()), ("stage2", 0o100644, STAGE2.encode())]
    with open(path, "wb") as f:
        f.write(cpio_newc(entries))


def run(script, timeout_s=900, mem_mib=1024, smp=2):
    """Boot the VM and run `script` (sh) in it as root. Returns (status or
    None if it never finished, output of the script, console log). The
    script may write result files into $OSR_VM_OUT; they are in the
    returned dict 'files' (name -> bytes)."""
    vmlinuz, moddir = fetch_kernel()
    work = tempfile.mkdtemp(prefix="osr-vm-")
    try:
        out = os.path.join(work, "out")
        os.mkdir(out)
        with open(os.path.join(out, "cmd.sh"), "w") as f:
            f.write("export OSR_VM_OUT=/osr-vm/out\n" + script)
        initrd = os.path.join(work, "initrd")
        build_initramfs(moddir, initrd)
        cmd = [QEMU, "-accel", "tcg", "-m", str(mem_mib), "-smp", str(smp), "-nographic",
               "-no-reboot", "-nic", "none", "-monitor", "none", "-serial", "stdio",
               "-kernel", vmlinuz, "-initrd", initrd,
               "-append", "console=ttyS0 panic=-1 quiet loglevel=3 rdinit=/init",
               "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,"
                          "multidevs=remap",
               "-virtfs", "local,path=%s,mount_tag=osrout,security_model=none" % out]
        try:
            r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True,
                               timeout=timeout_s)
            console = r.stdout.decode(errors="replace") + r.stderr.decode(errors="replace")
        except subprocess.TimeoutExpired as e:
            console = (e.stdout or b"").decode(errors="replace") + "\n[qemu killed: timeout]"
        files = {}
        for n in os.listdir(out):
            with open(os.path.join(out, n), "rb") as f:
                files[n] = f.read()
        status = files.get("status")
        status = int(status) if status and status.strip().isdigit() else None
        return status, files.get("output", b"").decode(errors="replace"), console, files
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    import sys
    import time
    t0 = time.time()
    st, output, console, _ = run(sys.argv[1] if len(sys.argv) > 1 else "uname -a; cat /proc/self/cgroup")
    print(console[-3000:])
    print("status", st, "output:\n" + output)
    print("seconds", round(time.time() - t0, 1))
