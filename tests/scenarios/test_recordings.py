"""Every recording of ADK runs names the google-adk release it came from, and that release is one the
project supports: a recording left behind when a release is dropped (or from one never added) fails
here, and is refreshed with its recorder (docs/testing.md, "Scenarios")."""

from __future__ import annotations

import pytest

from tests.scenarios.recordings import ROOT, VERSION_FILE, recording_folders, supported_adk_versions, version_of
from tests.support.recordings import VERSIONS


@pytest.mark.parametrize("folder", recording_folders())
def test_a_recording_comes_from_a_supported_adk_release(folder: str) -> None:
    assert (ROOT / folder / VERSION_FILE).is_file(), f"{folder} does not say which ADK it was recorded from"
    supported = supported_adk_versions()
    assert version_of(folder) in supported, (
        f"{folder} was recorded from google-adk {version_of(folder)}, which is not supported "
        f"(COMPAT_ADK and the project venv's: {sorted(supported)}); record it again"
    )


def test_each_supported_release_has_its_recordings_and_each_folder_is_the_release_it_says() -> None:
    # tests/support/recordings.py names each set's release by folder; the file must agree with it.
    recorded = {}
    for release, folders in VERSIONS.items():
        for folder in folders:
            assert version_of(folder).startswith(release), (folder, version_of(folder), release)
            recorded[folder] = version_of(folder)
    assert set(recorded.values()) == supported_adk_versions(), recorded
