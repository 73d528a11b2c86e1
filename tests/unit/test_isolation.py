"""The test session runs in a home of its own (tests/conftest.py): nothing is read from, or
left in, the developer's home, cache or temp dir."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from pipeline.engines.models import cache_root


def test_home_temp_dir_and_model_cache_are_the_sessions_own() -> None:
    home = Path.home()
    session = home.parent  # <session>/home, <session>/tmp, <session>/cache
    assert home.name == "home" and session.name.startswith("sst")
    assert Path(tempfile.gettempdir()) == session / "tmp" == Path(os.environ["TMPDIR"])
    assert cache_root() == session / "cache"  # the embedded model is built here, once per session
    ray_tmp = Path(os.environ["RAY_TMPDIR"])
    assert ray_tmp.parent == Path("/tmp") and ray_tmp.name.startswith("ssr") and ray_tmp.is_dir()


def test_a_test_s_own_temp_folder_lies_inside_the_session(tmp_path: Path) -> None:
    assert Path(tempfile.gettempdir()) in tmp_path.parents
