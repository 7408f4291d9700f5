"""A registry used from several threads at once (two ``api.run`` calls in one
script): the first lookups of an entry by path, made together, all get the
object; none sees the entry half moved (the ``KeyError`` of an unlocked lookup)."""

from __future__ import annotations

import sys
import threading

from securevfl.registry import Registry


def test_threads_looking_up_an_entry_by_path_at_once_all_get_it(tmp_path, monkeypatch):
    name = f"svfl_slow_plugin_{tmp_path.name.replace('-', '_')}"
    # an import that takes a while: every thread asks while the first one imports
    source = "import time\n\ntime.sleep(0.5)\n\n\nclass Thing:\n    name = 'thing'\n"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[type] = Registry("thing")
    reg.add_path("thing", f"{name}:Thing")
    n = 8
    start = threading.Barrier(n)
    got: list[object] = []
    errors: list[BaseException] = []

    def look() -> None:
        start.wait()
        try:
            got.append(reg.get("thing"))
        except BaseException as exc:  # the test reports whatever a thread raised
            errors.append(exc)

    threads = [threading.Thread(target=look) for _ in range(n)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors, [repr(e) for e in errors]
        assert len(got) == n and all(g is sys.modules[name].Thing for g in got)
        assert reg.names() == ["thing"] and "thing" in reg
    finally:
        sys.modules.pop(name, None)
