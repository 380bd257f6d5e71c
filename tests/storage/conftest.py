import pytest
from gcs_server import server


@pytest.fixture
def gcs():
    """The fake-gcs-server of this process."""
    return server()


@pytest.fixture
def bucket(gcs):
    """A new, empty bucket: its gs:// URL."""
    return f"gs://{gcs.create_bucket()}"
