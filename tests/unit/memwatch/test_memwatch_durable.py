"""memwatch writes its state and its incident archive at the moment a host may need a hard reset:
both reach the disk (the file and the rename into its folder) before memwatch goes on; the
metrics file, rewritten every sample, does not pay for it."""
import os

from test_memwatch_daemon import drive


def watch_fsyncs(mw, monkeypatch):
    """The paths mw's fsync calls were made on, in order."""
    seen = []
    real = os.fsync

    def fsync(fd):
        seen.append(os.readlink("/proc/self/fd/%d" % fd))
        return real(fd)

    monkeypatch.setattr(mw.os, "fsync", fsync)
    return seen


def test_the_state_and_the_archive_reach_the_disk(mw, lab, monkeypatch):
    seen = watch_fsyncs(mw, monkeypatch)
    dog = lab.watchdog(mw, stop_grace_s=3)
    assert drive(dog, lab, [(60, 30)] * 3 + [(5, 3)] * 12) == [(8, "available")]
    (archive,) = os.listdir(lab.config["archive_dir"])
    state = lab.config["state_file"]
    # the archive: its temp file before the rename, then its folder
    tmp_archive = [p for p in seen if os.path.basename(p) == archive and p != os.path.join(lab.config["archive_dir"], archive)]
    assert tmp_archive, seen
    assert seen.index(os.path.realpath(lab.config["archive_dir"])) > seen.index(tmp_archive[0]), seen
    # the state: a temp file beside it, then its folder
    assert any(os.path.basename(p).startswith("." + os.path.basename(state) + ".") for p in seen), seen
    assert os.path.realpath(os.path.dirname(state)) in seen, seen
    metrics = lab.config.get("metrics_file")
    assert not metrics or not any(os.path.basename(p).startswith("." + os.path.basename(metrics)) for p in seen), seen
