"""A request's token lists (engine/core/request.py) and the sampler's row built from them."""

from engine.core.request import Request
from engine.messages import SamplingParams
from engine.output.sampler import SamplingRow


def test_output_ids_follow_the_appended_tokens_without_a_copy_per_read():
    request = Request("r", [5, 6, 7], SamplingParams(), max_tokens=8)
    assert request.output_token_ids == []
    for token in (11, 12, 13):
        request.append_token(token)
        assert request.output_token_ids == request.all_token_ids[3:]
    assert request.output_token_ids is request.output_token_ids  # the step reads it per row: no slice
    assert request.num_output_tokens == 3 and request.all_token_ids == [5, 6, 7, 11, 12, 13]


def test_a_sampling_row_counts_its_outputs_when_built_even_if_the_request_grows_later():
    request = Request("r", [5], SamplingParams(seed=3), max_tokens=8)
    request.append_token(9)
    row = SamplingRow(
        request.params, request.prompt_token_ids, request.output_token_ids, num_pending_outputs=1
    )
    request.append_token(10)  # the pending token, committed by a later read
    assert row.num_output_tokens == 2  # its seeded position stays the one the step sampled at
