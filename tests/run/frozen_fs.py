"""A file system whose calls stop returning on demand, as an FSx for Lustre or NFS mount's do when
its server or its network is gone, or slow as a busy one's: a FUSE passthrough of a folder (fusepy
over Debian's libfuse 2), read-only or writable, served by a process of its own and always
unmounted. `freeze(ops, name)` makes the calls of `ops` ("read": reads; "write": a writable one's
writes, creates, renames and removals; "all": every call, a listing and a stat too) on files whose
name matches `name` (fnmatch) wait until `thaw()`; as an NFS hard mount's, a held call still yields
to SIGKILL. The server reads the rule from a file outside the mount on every call, so a freeze
takes at once, and reads bypass the page cache (direct_io), so that every one reaches it. Each host
of a job has a mount of its own, as each node has: one file system per rank that is to be frozen
alone (the kernel serialises some calls on a file across the processes that use it)."""
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVER = r'''
import errno, fnmatch, os, sys, time
import fuse

source, control, writable = sys.argv[1], sys.argv[3], sys.argv[4] == "rw"


def hold(op, path):
    """Waits while the rule in the control file covers this call; notes each call it holds."""
    noted = False
    while True:
        try:
            with open(control) as f:
                ops, name = f.read().split()
        except (OSError, ValueError):
            return
        if ops not in ("all", op) or not fnmatch.fnmatch(os.path.basename(path) or "/", name):
            return
        if not noted:
            with open(control + ".held", "a") as f:
                f.write(f"{op} {path}\n")
            noted = True
        # As an NFS hard mount's calls, a held one still yields to SIGKILL: the kernel then asks
        # for it to be interrupted (libfuse's -o intr), and it fails with EINTR.
        if fuse._libfuse.fuse_interrupted():
            raise fuse.FuseOSError(errno.EINTR)
        time.sleep(0.05)


class Passthrough(fuse.Operations):
    def real(self, path):
        return os.path.join(source, path.lstrip("/"))

    def getattr(self, path, fh=None):
        hold("stat", path)
        try:
            st = os.lstat(self.real(path))
        except OSError as e:
            raise fuse.FuseOSError(e.errno)
        keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_atime", "st_mtime",
                "st_ctime")
        return {k: getattr(st, k) for k in keys}

    def readdir(self, path, fh):
        hold("list", path)
        return [".", "..", *os.listdir(self.real(path))]

    def access(self, path, mode):
        hold("stat", path)
        if mode & os.W_OK and not writable:
            raise fuse.FuseOSError(errno.EROFS)
        if not os.access(self.real(path), mode):
            raise fuse.FuseOSError(errno.EACCES)

    def open(self, path, flags):
        hold("open", path)
        if flags & (os.O_WRONLY | os.O_RDWR) and not writable:
            raise fuse.FuseOSError(errno.EROFS)
        return os.open(self.real(path), flags & ~os.O_CREAT)

    # Writable (a folder for checkpoints): every call that changes the folder or a file is a
    # "write", held as reads are.
    def create(self, path, mode, fi=None):
        hold("write", path)
        return os.open(self.real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def write(self, path, data, offset, fh):
        hold("write", path)
        return os.pwrite(fh, data, offset)

    def fsync(self, path, datasync, fh):
        hold("write", path)
        os.fsync(fh)

    def truncate(self, path, length, fh=None):
        hold("write", path)
        os.truncate(self.real(path), length)

    def rename(self, old, new):
        hold("write", new)
        os.rename(self.real(old), self.real(new))

    def unlink(self, path):
        hold("write", path)
        os.unlink(self.real(path))

    def mkdir(self, path, mode):
        hold("write", path)
        os.mkdir(self.real(path), mode)

    def chmod(self, path, mode):
        os.chmod(self.real(path), mode)

    def utimens(self, path, times=None):
        os.utime(self.real(path), times)

    def read(self, path, size, offset, fh):
        hold("read", path)
        return os.pread(fh, size, offset)

    def release(self, path, fh):
        os.close(fh)

    def statfs(self, path):
        st = os.statvfs(self.real(path))
        return {k: getattr(st, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree",
                                            "f_bavail", "f_files", "f_ffree", "f_namemax")}


fuse.FUSE(Passthrough(), sys.argv[2], foreground=True, ro=not writable, nothreads=False,
          allow_other=True, attr_timeout=0, entry_timeout=0, direct_io=True,
          intr=True)
'''


class FrozenFs:
    """`mount`: the passthrough of `source`, mounted; read-only unless `writable`."""

    def __init__(self, source, folder, writable=False):
        self.source, self.mount = Path(source), Path(folder) / "mnt"
        self.control = Path(folder) / "freeze"
        self.mount.mkdir()
        self.thaw()
        script = Path(folder) / "frozen_fs_server.py"
        script.write_text(SERVER)
        self.log = open(Path(folder) / "frozen_fs.log", "w")
        self.server = subprocess.Popen(
            [sys.executable, str(script), str(self.source), str(self.mount), str(self.control),
             "rw" if writable else "ro"],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.ismount(self.mount):
            if self.server.poll() is not None or time.monotonic() > deadline:
                self.close()
                pytest.fail("the FUSE passthrough did not mount: "
                            f"{(Path(folder) / 'frozen_fs.log').read_text()}")
            time.sleep(0.05)

    def freeze(self, ops="read", name="*"):
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(f"{ops} {name}\n")
        tmp.rename(self.control)

    def thaw(self):
        self.control.write_text("")

    def held(self):
        """The calls held so far, "OP PATH" each."""
        held = Path(str(self.control) + ".held")
        return held.read_text().splitlines() if held.exists() else []

    def wait_held(self, proc, timeout):
        """Waits until a call is held; fails when `proc` ends first or at the timeout."""
        deadline = time.monotonic() + timeout
        while not self.held():
            assert proc.poll() is None, "the process ended before a call was held"
            assert time.monotonic() < deadline, f"no call held in {timeout} s"
            time.sleep(0.05)

    def close(self):
        """Thaws (so that no process stays blocked in a call), unmounts, ends the server."""
        self.thaw()
        # Whether or not it still looks mounted: a mount whose server was killed (a job's
        # teardown that kills whatever names its folder) fails every stat, ismount's too.
        subprocess.run(["fusermount", "-u", "-z", str(self.mount)], capture_output=True,
                       timeout=30)
        if self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(timeout=10)
        self.log.close()


@pytest.fixture
def frozen_fs(tmp_path):
    """make(source, writable=False) -> a FrozenFs over `source`; each is unmounted at the end,
    also on failure."""
    pytest.importorskip("fuse", reason="fusepy is missing: run scripts/setup.sh")
    if not os.path.exists("/dev/fuse") or not shutil.which("fusermount"):
        pytest.skip("no /dev/fuse or fusermount on this machine: scripts/setup.sh installs fuse3")
    made = []

    def make(source, writable=False):
        folder = tmp_path / f"fuse{len(made)}"
        folder.mkdir()
        made.append(FrozenFs(source, folder, writable))
        return made[-1]

    yield make
    for fs in made:
        fs.close()
