import pytest

try:
    import torch
except ImportError:          # each test module skips itself (pytest.importorskip, with a reason)
    torch = None


@pytest.fixture(autouse=True, scope="package")
def _one_thread():
    """Tiny shapes: one intra-op thread is faster and steadier (no oversubscription)."""
    if torch is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
