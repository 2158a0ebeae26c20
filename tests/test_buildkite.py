import json

import pytest
import yaml

from conftest import ROOT

SCHEMA = ROOT.parent / "shared" / "data" / "buildkite" / "pipeline-schema.json"


@pytest.mark.skipif(not SCHEMA.is_file(), reason="Buildkite's schema is not beside the repo")
def test_pipeline_is_valid_buildkite():
    jsonschema = pytest.importorskip("jsonschema")
    pipeline = yaml.safe_load((ROOT / ".buildkite" / "pipeline.yml").read_text())
    jsonschema.validate(pipeline, json.loads(SCHEMA.read_text()))
    commands = " ".join(s.get("command", "") for s in pipeline["steps"])
    assert "make test" in commands and "make compare" in commands


def test_pipeline_schema_rejects_nonsense():
    jsonschema = pytest.importorskip("jsonschema")
    if not SCHEMA.is_file():
        pytest.skip("no schema")
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"steps": [{"command": 5, "timeout_in_minutes": "soon"}]}, json.loads(SCHEMA.read_text()))
