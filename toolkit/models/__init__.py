"""Models: the Model contract (base.py), the layers library (layers/), one file per family
(Llama/Mistral/Qwen, Gemma 2/3, Phi-3), the registry, weight loading, the embedded default
model, chat templates.

from toolkit.models import default_model_path, load_model, load_tokenizer, apply_chat_template
path = default_model_path()                    # SmolLM2-135M-Instruct, converted once
embedding_model_path()                         # all-MiniLM-L6-v2 (sentence-transformers folder)
model = load_model(path, dtype=torch.float32, device="cpu")
tok = load_tokenizer(path)
"""

from toolkit.models.chat import apply_chat_template
from toolkit.models.embedded import default_model_path
from toolkit.models.embedded_encoder import embedding_model_path
from toolkit.models.base import LayerAttention, Model, ModelSpec
from toolkit.models.loader import load_model, load_tokenizer, model_class
from toolkit.models.registry import register_model

__all__ = [
    "LayerAttention",
    "Model",
    "ModelSpec",
    "register_model",
    "apply_chat_template",
    "default_model_path",
    "embedding_model_path",
    "load_model",
    "load_tokenizer",
    "model_class",
]
