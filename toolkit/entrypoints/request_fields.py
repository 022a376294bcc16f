"""Per-prompt scheduling fields of `LLM.generate`: one value for all prompts or one per prompt."""

from __future__ import annotations

from typing import Any, Sequence


def per_prompt_fields(n: int, *, priority: Any = None, priorities: Any = None, client_id: Any = None,
                      deadline: Any = None, expected_output_len: Any = None,
                      lora_request: Any = None) -> list[dict[str, Any]]:
    """The add_request keyword arguments of each of n prompts.

    Each field is None (not given), one value for every prompt, or a list / tuple of n values
    (None in it = not given for that prompt). `priorities` is the older spelling of vLLM's
    `priority`; giving both is an error."""
    if priority is not None and priorities is not None:
        raise ValueError("give priority= (vLLM's name) or priorities= (its alias), not both")
    given = {"priority": priority if priority is not None else priorities, "client_id": client_id,
             "deadline": deadline, "expected_output_len": expected_output_len, "lora_request": lora_request}
    rows: list[dict[str, Any]] = [{} for _ in range(n)]
    for name, value in given.items():
        if value is None:
            continue
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            values = [value] * n
        else:
            values = list(value)
            if len(values) != n:
                raise ValueError(f"got {len(values)} values of {name} for {n} prompts; give one value "
                                 "or one per prompt")
        for row, v in zip(rows, values):
            if v is not None:
                row[name] = v
    return rows
