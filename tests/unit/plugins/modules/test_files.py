"""sparkops.appliance.files on paths the tests make: in this process (harness.run_module), and once
through Ansible itself (ansible localhost -m ...) for the wiring."""
import json
import os

from ansible_collections.sparkops.appliance.plugins.modules import files as files_module

from harness import run_module as run_in_process
from harness import run_adhoc as adhoc


def module_args(entries, units=None, read=None):
    # no ownership record: this machine's /var/lib/sparkops is not the tests' (test_owned_names tests it)
    args = {"files": entries, "record": ""}
    if units is not None:
        args["units"] = units
    if read is not None:
        args["read"] = read
    return args


def run_module(entries, check=False, diff=False, units=None, read=None):
    return run_in_process(files_module, module_args(entries, units, read), check=check, diff=diff)


def through_ansible(entries, check=False, diff=False, units=None, read=None):
    return adhoc("files", module_args(entries, units, read), check=check, diff=diff)


def entries(tmp_path, unit="[Unit]\nDescription=x\n", script_mode="0755"):
    base = tmp_path / "etc" / "x"
    return [{"path": str(base), "state": "directory", "mode": "0750"},
            {"path": str(base / "x.service"), "content": unit, "mode": "0644"},
            {"path": str(base / "helper"), "content": "#!/bin/sh\nexit 0\n", "mode": script_mode}]


def state(tmp_path):
    out = {}
    for dirpath, _dirs, names in os.walk(tmp_path):
        for name in [""] + names:
            path = os.path.join(dirpath, name)
            st = os.stat(path)
            out[path] = (oct(st.st_mode & 0o7777), st.st_ino, st.st_mtime_ns,
                         open(path, "rb").read() if os.path.isfile(path) else None)
    return out


def test_creates_then_changes_nothing(tmp_path):
    """The first call through Ansible itself (the module found by its name, its result as a task
    returns it); the second in this process."""
    first = through_ansible(entries(tmp_path))
    assert first["changed"] is True and len(first["changed_paths"]) == 3
    base = tmp_path / "etc" / "x"
    assert oct(os.stat(base).st_mode & 0o777) == "0o750"
    assert (base / "x.service").read_text() == "[Unit]\nDescription=x\n"
    assert oct(os.stat(base / "helper").st_mode & 0o777) == "0o755"
    before = state(tmp_path)
    again = run_module(entries(tmp_path))
    assert again["changed"] is False and again["changed_paths"] == []
    assert state(tmp_path) == before


def test_one_changed_file_is_replaced_whole_and_only_it(tmp_path):
    run_module(entries(tmp_path))
    base = tmp_path / "etc" / "x"
    helper = os.stat(base / "helper")
    old_inode = os.stat(base / "x.service").st_ino
    result = run_module(entries(tmp_path, unit="[Unit]\nDescription=y\n"), diff=True)
    assert result["changed_paths"] == [str(base / "x.service")]
    assert (base / "x.service").read_text() == "[Unit]\nDescription=y\n"
    assert os.stat(base / "x.service").st_ino != old_inode      # renamed over, not rewritten in place
    assert os.stat(base / "helper").st_mtime_ns == helper.st_mtime_ns
    assert "Description=y" in json.dumps(result["diff"])
    assert [n for n in os.listdir(base) if n.startswith(".")] == []   # no temp file left


def test_a_mode_only_change_is_applied(tmp_path):
    run_module(entries(tmp_path))
    result = run_module(entries(tmp_path, script_mode="0700"))
    assert result["changed_paths"] == [str(tmp_path / "etc" / "x" / "helper")]
    assert oct(os.stat(tmp_path / "etc" / "x" / "helper").st_mode & 0o777) == "0o700"


def test_a_new_0600_file_is_never_readable_by_others(tmp_path, monkeypatch):
    """The mode a new file has the moment the rename makes it visible, before the module sets the
    entry's mode: no group or other bit for an 0600 file (atomic_move gives a file it creates
    0666 less the umask)."""
    from ansible.module_utils.basic import AnsibleModule
    real_move = AnsibleModule.atomic_move
    seen = {}

    def watching_move(self, src, dest, *args, **kwargs):
        real_move(self, src, dest, *args, **kwargs)
        seen[dest] = os.stat(dest).st_mode & 0o777

    monkeypatch.setattr(AnsibleModule, "atomic_move", watching_move)
    old_umask = os.umask(0o022)
    try:
        env = str(tmp_path / "serve.env")
        run_module([{"path": env, "content": "VLLM_API_KEY=k\n", "mode": "0600"}])
        assert seen[env] & 0o077 == 0, oct(seen[env])
        assert oct(os.stat(env).st_mode & 0o777) == "0o600"
        assert os.umask(0o022) == 0o022          # the module left the process's umask as it was
    finally:
        os.umask(old_umask)


def test_check_mode_tells_and_writes_nothing(tmp_path):
    result = run_module(entries(tmp_path), check=True)
    assert result["changed"] is True and len(result["changed_paths"]) == 3
    assert not (tmp_path / "etc").exists()
    run_module(entries(tmp_path))
    before = state(tmp_path)
    result = run_module(entries(tmp_path, unit="[Unit]\nDescription=z\n", script_mode="0700"), check=True)
    assert len(result["changed_paths"]) == 2
    assert state(tmp_path) == before


def test_a_file_failing_validation_keeps_the_old_one_and_names_it(tmp_path):
    run_module(entries(tmp_path))
    base = tmp_path / "etc" / "x"
    bad = entries(tmp_path, unit="broken\n")
    bad[1]["validate"] = "grep -q '^\\[Unit\\]' %s"
    result = run_module(bad)
    assert result.get("failed") is True
    assert str(base / "x.service") in result["msg"] and "fails validation" in result["msg"]
    assert (base / "x.service").read_text() == "[Unit]\nDescription=x\n"
    assert [n for n in os.listdir(base) if n.startswith(".")] == []
    good = entries(tmp_path, unit="[Unit]\nDescription=v\n")
    good[1]["validate"] = "grep -q '^\\[Unit\\]' %s"
    assert run_module(good)["changed_paths"] == [str(base / "x.service")]


def test_a_file_without_its_directory_or_content_is_refused(tmp_path):
    result = run_module([{"path": str(tmp_path / "no" / "f"), "content": "x", "mode": "0644"}])
    assert result.get("failed") is True and "does not exist" in result["msg"]
    result = run_module([{"path": str(tmp_path / "f"), "mode": "0644"}])
    assert result.get("failed") is True and "content is required" in result["msg"]


def test_an_empty_owner_leaves_the_owner_as_it_is(tmp_path):
    """A folder another package owns (memwatch's textfile-collector folder): owner "" keeps it."""
    folder = tmp_path / "textfile"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    result = run_module([{"path": str(folder), "state": "directory", "mode": "0755", "owner": "", "group": ""}])
    assert result.get("failed") is not True, result
    assert (os.stat(folder).st_uid, os.stat(folder).st_gid) == (65534, 65534)
    run_module([{"path": str(folder), "state": "directory", "mode": "0755"}])
    assert os.stat(folder).st_uid == 0      # the default is root, as the roles' tasks had it


def test_a_bad_entry_is_refused_before_any_path_is_touched(tmp_path):
    """A later entry's bad input fails the task before an earlier entry is written."""
    first = {"path": str(tmp_path / "made"), "state": "directory", "mode": "0755"}
    for bad, words in (({"path": str(tmp_path / "f"), "content": "x", "mode": "0644", "validate": "true"}, "must contain %s"),
                       ({"path": str(tmp_path / "f"), "mode": "0644"}, "content is required"),
                       ({"path": "relative/f", "content": "x", "mode": "0644"}, "must be absolute")):
        result = run_module([first, bad])
        assert result.get("failed") is True and words in result["msg"], result
        assert not (tmp_path / "made").exists()


SHOW = """Id=a.service
LoadState=loaded
ActiveState=active
UnitFileState=enabled
NeedDaemonReload=no

Id=b.timer
LoadState=not-found
ActiveState=inactive
UnitFileState=
NeedDaemonReload=no
"""


def fake_systemctl(tmp_path, out, rc=0):
    """A systemctl on PATH that records its arguments and prints `out` (systemd cannot run here)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "systemctl"
    script.write_text("#!/bin/sh\necho \"$@\" >> %s\ncat <<'EOF'\n%sEOF\nexit %d\n" % (tmp_path / "calls", out, rc))
    script.chmod(0o755)
    return str(bin_dir)


def test_units_are_reported_from_one_systemctl_show_also_in_check_mode(tmp_path, monkeypatch):
    bin_dir = fake_systemctl(tmp_path, SHOW)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    for check in (True, False):
        res = run_module(entries(tmp_path), check=check, units=["a.service", "b.timer"])
        assert res["units"] == {
            "a.service": {"LoadState": "loaded", "ActiveState": "active", "UnitFileState": "enabled", "NeedDaemonReload": "no"},
            "b.timer": {"LoadState": "not-found", "ActiveState": "inactive", "UnitFileState": "", "NeedDaemonReload": "no"}}
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["show --property=Id,LoadState,ActiveState,UnitFileState,NeedDaemonReload -- a.service b.timer"] * 2


def test_no_units_are_reported_when_systemd_cannot_be_asked(tmp_path, monkeypatch):
    # systemctl fails (no systemd as PID 1), or prints fewer blocks than units asked: nothing is
    # reported, so a role runs its systemd_service call as it would without the option.
    bin_dir = fake_systemctl(tmp_path, "", rc=1)
    monkeypatch.setenv("PATH", bin_dir + os.pathsep + os.environ["PATH"])
    assert run_module(entries(tmp_path), units=["a.service"])["units"] == {}
    (tmp_path / "calls").unlink()
    os.rename(bin_dir, str(tmp_path / "old"))
    assert fake_systemctl(tmp_path, SHOW.split("\n\n", maxsplit=1)[0] + "\n") == bin_dir   # the same PATH entry
    assert run_module(entries(tmp_path), units=["a.service", "b.timer"])["units"] == {}
    assert run_module(entries(tmp_path))["units"] == {}   # none asked: systemctl not run
    assert len((tmp_path / "calls").read_text().splitlines()) == 1


def test_read_gives_the_text_before_the_call_and_null_for_a_missing_file(tmp_path):
    state = tmp_path / "state.json"
    state.write_text('{"current": "a"}\n')
    ents = entries(tmp_path) + [{"path": str(state), "content": '{"current": "b"}\n', "mode": "0644"}]
    missing = str(tmp_path / "nothing-here")
    for check in (True, False):   # read also in check mode; the file is written only outside it
        res = run_module(ents, check=check, read=[str(state), missing])
        assert res["contents"] == {str(state): '{"current": "a"}\n', missing: None}
    assert state.read_text() == '{"current": "b"}\n'
    assert run_module(ents, read=[str(state)])["contents"] == {str(state): '{"current": "b"}\n'}


def test_an_unreadable_path_to_read_fails_the_task_naming_it(tmp_path):
    res = run_module(entries(tmp_path), read=[str(tmp_path)])   # a directory
    assert res.get("failed") and str(tmp_path) in res["msg"], res


def test_absent_removes_a_file_and_a_whole_folder_and_drops_them_from_the_record(tmp_path):
    """state absent: what the serve role removes of a model the host no longer serves."""
    base = tmp_path / "etc" / "x"
    record = tmp_path / "owned.json"
    kept = str(tmp_path / "kept.conf")
    args = dict(module_args(entries(tmp_path)), record=str(record))
    assert run_in_process(files_module, args)["changed"] is True
    (base / "sub").mkdir()
    (base / "sub" / "state.json").write_text("{}")
    record.write_text(json.dumps({"paths": json.loads(record.read_text())["paths"] + [kept]}))
    gone = [{"path": str(base / "helper"), "state": "absent"}, {"path": str(base), "state": "absent"},
            {"path": str(tmp_path / "never-there"), "state": "absent"}]
    check = run_in_process(files_module, dict(args, files=gone), check=True)
    assert check["changed"] is True and (base / "helper").exists()
    done = run_in_process(files_module, dict(args, files=gone))
    assert done["changed_paths"] == [str(base / "helper"), str(base)]
    assert not base.exists()
    assert json.loads(record.read_text())["paths"] == [kept]     # the folder's files went with it
    again = run_in_process(files_module, dict(args, files=gone))
    assert again["changed"] is False


def test_mode_is_needed_but_for_absent(tmp_path):
    result = run_module([{"path": str(tmp_path / "f"), "content": "x"}])
    assert result.get("failed") is True and "files[].mode is required" in result["msg"], result
    assert not (tmp_path / "f").exists()
