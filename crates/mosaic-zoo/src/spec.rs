//! Model and module specifications: architecture, input size per sample, DAG edges, batch.

use serde::Serialize;

/// What a module does in its model's DAG.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Turns one modality's raw input into features (a transformer stack).
    Encoder,
    /// A token-embedding table only (no transformer layers): lookup, no matmuls.
    Embedding,
    /// The shared model the encoders feed (an LLM or an encoder–decoder "universal model").
    Backbone,
    /// Produces one output modality from the backbone's states.
    Decoder,
    /// A small head joining several modules (contrastive alignment, distillation).
    Head,
}

/// A weight matrix or table outside the repeated transformer layers (patch embedding,
/// projection, LM head, token embedding).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Extra {
    /// What it is, e.g. `"patch embedding 14×14×3 → 1024"`.
    pub what: String,
    /// Entries of the matrix or table.
    pub weights: u64,
    /// The weights belong to another module (a head tied to a token embedding): their FLOPs
    /// count here, their parameters do not.
    pub shared: bool,
    /// Tokens per sample it is applied to.
    pub tokens: u32,
    /// A lookup table (gather, no FLOPs) rather than a matmul (2·weights FLOPs per token).
    pub lookup: bool,
    /// Classes whose logits are materialised per token for a loss (0 when it is not a head).
    pub vocab: u32,
}

impl Extra {
    /// Parameters this module owns through the extra.
    pub fn params(&self) -> u64 {
        if self.shared {
            0
        } else {
            self.weights
        }
    }
}

/// The module's row of the paper's Table 1, when it has one.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PaperRow {
    /// Layers as Table 1 lists them.
    pub layers: u32,
    /// Dimension as Table 1 lists it.
    pub dim: u32,
    /// TFLOPs per sample as Table 1 lists them (input configuration of Table 2).
    pub tflops: f64,
    /// Compute intensity in FLOP/byte as Table 1 lists it.
    pub ci: f64,
}

/// One module: a transformer stack (possibly encoder–decoder) plus extra matrices.
///
/// Every transformer layer has `heads × (hidden / heads)` attention (grouped-query when
/// `kv_heads < heads`) and an MLP of width `ffn` (SwiGLU-style with three matrices when
/// `gated_ffn`). Decoder layers add cross-attention over the `tokens` of the encoder layers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleSpec {
    /// Unique name inside the model.
    pub name: String,
    /// What the module does.
    pub role: Role,
    /// Modules whose output this one consumes (DAG edges).
    pub after: Vec<String>,
    /// Transformer (encoder or decoder-only) layers over `tokens`.
    pub layers: u32,
    /// Decoder layers with cross-attention over `decoder_tokens` (encoder–decoder backbones).
    pub decoder_layers: u32,
    /// Hidden size.
    pub hidden: u32,
    /// Attention heads.
    pub heads: u32,
    /// Key/value heads (grouped-query attention); equal to `heads` otherwise.
    pub kv_heads: u32,
    /// MLP inner width.
    pub ffn: u32,
    /// Gated MLP (SwiGLU: gate, up and down matrices) instead of two matrices.
    pub gated_ffn: bool,
    /// Causal self-attention (half the attention FLOPs with a causal FlashAttention kernel).
    pub causal: bool,
    /// Attention runs as one fused (FlashAttention-style) kernel; when false the per-head
    /// score matrix is written to HBM, normalised and kept for backward.
    pub fused_attention: bool,
    /// Sequence length per sample after patchify/tokenisation (the encoder side).
    pub tokens: u32,
    /// Decoder sequence length per sample (0 without decoder layers).
    pub decoder_tokens: u32,
    /// How the input of Table 2 becomes `tokens`.
    pub input: String,
    /// Matrices and tables outside the layers.
    pub extras: Vec<Extra>,
    /// Parameters in total (layers and extras; norms and biases neglected).
    pub params: u64,
    /// Trained (weights get gradients and AdamW state) or frozen (forward only).
    pub trainable: bool,
    /// The architecture is our assumption, not published (see `source`).
    pub assumed: bool,
    /// Where the architecture comes from.
    pub source: String,
    /// The paper's Table 1 row for this module, when it has one.
    pub paper: Option<PaperRow>,
}

impl ModuleSpec {
    /// A trainable module with no layers yet; the builder methods below fill it in.
    pub fn new(name: &str, role: Role) -> Self {
        ModuleSpec {
            name: name.into(),
            role,
            after: Vec::new(),
            layers: 0,
            decoder_layers: 0,
            hidden: 0,
            heads: 0,
            kv_heads: 0,
            ffn: 0,
            gated_ffn: false,
            causal: false,
            fused_attention: true,
            tokens: 0,
            decoder_tokens: 0,
            input: String::new(),
            extras: Vec::new(),
            params: 0,
            trainable: true,
            assumed: false,
            source: String::new(),
            paper: None,
        }
    }

    /// Sets the transformer stack: layers, hidden size, heads (kv heads = heads), MLP width.
    pub fn stack(mut self, layers: u32, hidden: u32, heads: u32, ffn: u32) -> Self {
        (
            self.layers,
            self.hidden,
            self.heads,
            self.kv_heads,
            self.ffn,
        ) = (layers, hidden, heads, heads, ffn);
        self.recount()
    }

    /// Sets the hidden size of a module without layers (an embedding table or a head).
    pub fn width(mut self, hidden: u32) -> Self {
        self.hidden = hidden;
        self
    }

    /// Grouped-query attention with `kv_heads` key/value heads.
    pub fn gqa(mut self, kv_heads: u32) -> Self {
        self.kv_heads = kv_heads;
        self.recount()
    }

    /// A gated (SwiGLU) MLP.
    pub fn gated(mut self) -> Self {
        self.gated_ffn = true;
        self.recount()
    }

    /// Causal self-attention.
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// Unfused attention: the score matrix goes through HBM (e.g. biases added to the logits).
    pub fn unfused_attention(mut self) -> Self {
        self.fused_attention = false;
        self
    }

    /// Adds `layers` decoder layers with cross-attention over `tokens` decoder tokens.
    pub fn decoder(mut self, layers: u32, tokens: u32) -> Self {
        (self.decoder_layers, self.decoder_tokens) = (layers, tokens);
        self.recount()
    }

    /// Sets the sequence length per sample and how the input becomes it.
    pub fn tokens(mut self, tokens: u32, input: &str) -> Self {
        (self.tokens, self.input) = (tokens, input.into());
        self
    }

    /// Adds a matmul of `weights` weights applied to `tokens` tokens per sample.
    pub fn matmul(self, what: &str, weights: u64, tokens: u32) -> Self {
        self.extra(what, weights, tokens, false, 0, false)
    }

    /// Adds a lookup table of `weights` entries (rows × width) gathered at `tokens` tokens.
    pub fn lookup(self, what: &str, weights: u64, tokens: u32) -> Self {
        self.extra(what, weights, tokens, true, 0, false)
    }

    /// Adds an output head `hidden → vocab` over `tokens` tokens whose logits feed a loss;
    /// `tied` when its matrix is a token embedding owned by another module.
    pub fn head(self, what: &str, vocab: u32, tokens: u32, tied: bool) -> Self {
        let weights = self.hidden as u64 * vocab as u64;
        self.extra(what, weights, tokens, false, vocab, tied)
    }

    /// Adds a loss over `vocab`-way logits at `tokens` positions that it reads but does not
    /// compute (no weights, no FLOPs): a distillation or contrastive loss.
    pub fn loss(self, what: &str, vocab: u32, tokens: u32) -> Self {
        self.extra(what, 0, tokens, false, vocab, false)
    }

    fn extra(
        mut self,
        what: &str,
        weights: u64,
        tokens: u32,
        lookup: bool,
        vocab: u32,
        shared: bool,
    ) -> Self {
        self.extras.push(Extra {
            what: what.into(),
            weights,
            shared,
            tokens,
            lookup,
            vocab,
        });
        self.recount()
    }

    /// Frozen: forward only, no gradients or optimizer state.
    pub fn frozen(mut self) -> Self {
        self.trainable = false;
        self
    }

    /// The modules this one consumes.
    pub fn after(mut self, names: &[&str]) -> Self {
        self.after = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Where the architecture comes from.
    pub fn source(mut self, source: &str) -> Self {
        self.source = source.into();
        self
    }

    /// Marks the architecture as assumed (no public source).
    pub fn assumed(mut self) -> Self {
        self.assumed = true;
        self
    }

    /// Records the paper's Table 1 row.
    pub fn paper(mut self, layers: u32, dim: u32, tflops: f64, ci: f64) -> Self {
        self.paper = Some(PaperRow {
            layers,
            dim,
            tflops,
            ci,
        });
        self
    }

    /// Key/value width: `hidden × kv_heads / heads`.
    pub fn kv_dim(&self) -> u64 {
        if self.heads == 0 {
            0
        } else {
            self.hidden as u64 * self.kv_heads as u64 / self.heads as u64
        }
    }

    /// Parameters of one self-attention block (Q, K, V, O).
    pub fn attention_params(&self) -> u64 {
        let h = self.hidden as u64;
        2 * h * h + 2 * h * self.kv_dim()
    }

    /// Parameters of one MLP block.
    pub fn mlp_params(&self) -> u64 {
        let k = if self.gated_ffn { 3 } else { 2 };
        k * self.hidden as u64 * self.ffn as u64
    }

    /// Parameters of one encoder (or decoder-only) layer.
    pub fn layer_params(&self) -> u64 {
        if self.layers == 0 && self.decoder_layers == 0 {
            return 0;
        }
        self.attention_params() + self.mlp_params()
    }

    /// Parameters of one decoder layer: self-attention, cross-attention and MLP.
    pub fn decoder_layer_params(&self) -> u64 {
        if self.decoder_layers == 0 {
            return 0;
        }
        2 * self.attention_params() + self.mlp_params()
    }

    /// Sum of the parameters of the layers and the extras.
    pub fn count_params(&self) -> u64 {
        self.layers as u64 * self.layer_params()
            + self.decoder_layers as u64 * self.decoder_layer_params()
            + self.extras.iter().map(Extra::params).sum::<u64>()
    }

    fn recount(mut self) -> Self {
        self.params = self.count_params();
        self
    }
}

/// A multimodal model: modules, their DAG and the training batch.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Lower-case name, e.g. `ofasys`.
    pub name: String,
    /// One line, with its citation.
    pub description: String,
    /// The modules; `after` edges make them a DAG.
    pub modules: Vec<ModuleSpec>,
    /// Global batch on more than one node (Mosaic §5.1: 32).
    pub global_batch: u32,
    /// Global batch on a single node (Mosaic §5.1: "degrades to 16 for single-node experiments").
    pub single_node_batch: u32,
}

impl ModelSpec {
    /// A model with the paper's batch sizes (32, and 16 on one node).
    pub fn new(name: &str, description: &str, modules: Vec<ModuleSpec>) -> Self {
        ModelSpec {
            name: name.into(),
            description: description.into(),
            modules,
            global_batch: 32,      // Mosaic §5.1
            single_node_batch: 16, // Mosaic §5.1
        }
    }

    /// The global batch on `cluster`: 16 on a single node, 32 otherwise (Mosaic §5.1).
    pub fn batch_on(&self, cluster: &crate::ClusterSpec) -> u32 {
        if cluster.is_single_node() {
            self.single_node_batch
        } else {
            self.global_batch
        }
    }

    /// The module called `name`.
    pub fn module(&self, name: &str) -> Option<&ModuleSpec> {
        self.modules.iter().find(|m| m.name == name)
    }

    /// Parameters of all modules.
    pub fn params(&self) -> u64 {
        self.modules.iter().map(|m| m.params).sum()
    }
}
