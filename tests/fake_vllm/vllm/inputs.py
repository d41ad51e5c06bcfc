"""vllm.inputs.TokensPrompt: a dict holding the prompt's token ids (a TypedDict in vLLM)."""
from typing import TypedDict


class TokensPrompt(TypedDict):
    prompt_token_ids: list
