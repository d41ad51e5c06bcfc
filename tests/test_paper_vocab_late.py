"""The second half of test_paper_vocab.py's notebooks (every notebook not in its FIRST_HALF), in a file of its
own so that `make test`'s two workers (whole files each) share the suite's longest runs."""
import pytest

from cancellation import profiles
from test_paper_vocab import FIRST_HALF, check_paper_vocab


@pytest.fixture(scope="module")
def vocab_root(canonical_standins, tmp_path_factory):
    return tmp_path_factory.mktemp("paper-vocab-late")


@pytest.mark.slow
@pytest.mark.parametrize("ref", [p.stem[:2] for p in profiles.all_notebooks() if p.stem[:2] not in FIRST_HALF])
def test_paper_vocab_late(ref, vocab_root, tmp_path):
    """Every notebook with Qwen3's 151,936-wide LM head under the guard (`check_paper_vocab`)."""
    check_paper_vocab(ref, vocab_root, tmp_path)
