"""A trainer restarted from its checkpoint: the state, written to a file, restored in another process that
builds the pipeline again from the same code, continues exactly where the saved iterator stood."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.checkpoint_pipelines import BUILDERS, build, write_files
from tests.checkpoints import typed

pytestmark = pytest.mark.no_grpc

REPO = Path(__file__).resolve().parents[1]

_RESTORE = textwrap.dedent("""
    import json, sys
    from tests.checkpoint_pipelines import build
    from tests.checkpoints import typed
    directory, states_path = sys.argv[1], sys.argv[2]
    out = {}
    for name, state in json.load(open(states_path)).items():
        it = iter(build(name, directory))
        it.load_state_dict(state)
        out[name] = [typed(x) for x in it]
    json.dump(out, sys.stdout, default=bytes.hex)
""")


def test_a_state_from_a_file_resumes_in_a_new_process(tmp_path):
    write_files(str(tmp_path))
    heads, states, full = {}, {}, {}
    for name in BUILDERS:
        full[name] = [typed(x) for x in build(name, str(tmp_path))]
        it = iter(build(name, str(tmp_path)))
        cut = len(full[name]) // 2 + 1
        heads[name] = [typed(next(it)) for _ in range(cut)]
        states[name] = it.state_dict()
        it.close()
    states_path = tmp_path / "states.json"
    states_path.write_text(json.dumps(states))
    result = subprocess.run([sys.executable, "-c", _RESTORE, str(tmp_path), str(states_path)], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    rests = json.loads(result.stdout)
    for name in BUILDERS:
        # Through JSON on both sides: tuples become lists alike.
        assert json.loads(json.dumps(heads[name] + rests[name], default=bytes.hex)) == \
            json.loads(json.dumps(full[name], default=bytes.hex)), name
