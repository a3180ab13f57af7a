"""The model's tokenizer (from the GGUF file), with the calls vLLM users make on it."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

from . import _core
from ._engine import ChatMessage, render_chat


class Tokenizer:
    """The engine's own tokenizer: the ids it gives are the ids the engine runs."""

    def __init__(self, session: "_core.Session"):
        self._session = session

    def encode(self, text: str, add_special_tokens: bool = True) -> List[int]:
        """Token ids of ``text``; BOS added as the model asks when ``add_special_tokens``;
        special-token text (``<|im_start|>``) read as the token, as Hugging Face does."""
        return self._session.encode(text, add_special_tokens, True)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``token_ids``; control tokens left out when ``skip_special_tokens``."""
        return self._session.decode(list(token_ids), skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> List[str]:
        return [self._session.token_piece(t) for t in token_ids]

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage],
        tokenize: bool = True,
        add_generation_prompt: bool = False,
        tools: Optional[List[Dict[str, Any]]] = None,
        chat_template: Optional[str] = None,
        **kwargs: Any,
    ) -> Union[str, List[int]]:
        """The conversation through the chat template (Hugging Face's signature);
        the ids are those ``LLM.chat`` runs. Extra keyword arguments are template variables."""
        prompt = render_chat(self._session, messages, add_generation_prompt, chat_template, kwargs, tools)
        return prompt.token_ids if tokenize else prompt.text

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._session.eos_token_id if self._session.eos_token_id >= 0 else None

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._session.bos_token_id if self._session.bos_token_id >= 0 else None

    @property
    def vocab_size(self) -> int:
        return self._session.n_vocab

    def __len__(self) -> int:
        return self._session.n_vocab
