"""State files another process reads: always whole, whoever writes last."""

import threading

from vgpu_driver import state_files


def test_readers_see_whole_files_while_threads_write(tmp_path):
    """nova-compute's inventory update and the reconciler's passes write the
    same file from two threads; ``status`` and ``metrics`` read it meanwhile."""
    path = str(tmp_path / "reconciler.json")
    state_files.write(path, {"writer": -1, "payload": []})
    stop = threading.Event()
    seen = []

    def write(writer):
        for round_ in range(200):
            state_files.write(path, {"writer": writer, "payload": list(range(round_))})

    def read():
        while not stop.is_set():
            seen.append(state_files.read(path))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(n,)) for n in range(4)]
    for thread in writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    reader.join()
    assert seen and all("unreadable" not in s and "writer" in s for s in seen)
    assert state_files.read(path)["payload"] == list(range(199))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["reconciler.json"]


def test_a_missing_file_is_none_and_a_broken_one_is_said(tmp_path):
    assert state_files.read(str(tmp_path / "nothing.json")) is None
    (tmp_path / "broken.json").write_text("{")
    assert "broken.json" in state_files.read(str(tmp_path / "broken.json"))["unreadable"]
