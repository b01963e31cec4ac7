package memory

import (
	"fmt"
	"iter"

	"github.com/moescope/moescope/moe"
)

// withoutLogProbs drops the loss's vocabulary-sized records (the
// log-probabilities, or a compiled loss's logits and log-sum-exp): a
// chunked loss checkpoints each chunk and recomputes them in backward. The
// labels stay, held by the chunks' checkpoints as their inputs as nll_loss
// holds them unchunked.
func withoutLogProbs(rs []moe.SavedRecord) []moe.SavedRecord {
	var out []moe.SavedRecord
	for _, r := range rs {
		if r.Op != moe.OpLoss || r.Tensor == moe.SavedLabels {
			out = append(out, r)
		}
	}
	return out
}

// lossChunks yields the label suffix and token count of each chunk of the
// chunked loss: ⌈T/c⌉ tokens each, the last one shorter (torch.chunk's
// split, which may give fewer than c chunks).
func (s *stepBuilder) lossChunks() iter.Seq2[string, int64] {
	return func(yield func(string, int64) bool) {
		T, c := s.T, int64(s.o.LossChunks)
		tc := (T + c - 1) / c
		for k := int64(0); k < c && k*tc < T; k++ {
			if !yield(fmt.Sprintf(" chunk %d", k), min(tc, T-k*tc)) {
				return
			}
		}
	}
}

// lossBytes is the size of one element of the eager loss's tensors.
func (s *stepBuilder) lossBytes() int64 { return s.sh.LossDType.Bytes() }

// upcast reports whether the eager loss copies the logits into another
// type first (torchtitan's pred.float()).
func (s *stepBuilder) upcast() bool { return s.sh.LossDType != s.o.Precision.Activation }

// logProbs emits the eager loss's forward over n = tokens × V elements: the
// LM head's logits (activation type), their copy in the loss type when it
// upcasts, and the log-probabilities computed from it (keep allocates
// them), then the frees of the copy and of the logits (torchtitan's `del
// pred`; AutoModel's trainer holds them to the end of backward instead,
// freeHeldLogits). suffix ends each label.
func (s *stepBuilder) logProbs(layer int, suffix string, n int64, keep func()) {
	act := s.o.Precision.Activation.Bytes()
	s.alloc(layer, "logits"+suffix, n*act, CatLoss)
	if s.upcast() {
		s.alloc(layer, "logits_f32"+suffix, n*s.lossBytes(), CatLoss)
	}
	keep()
	if s.upcast() {
		s.free(layer, "logits_f32"+suffix, n*s.lossBytes(), CatLoss)
	}
	if !s.holdsLogits() {
		s.free(layer, "logits"+suffix, n*act, CatLoss)
	}
}

// holdsLogits reports whether the trainer keeps the model's output, the
// logits, referenced until its backward call returns: AutoModel's
// train_ft.py (_forward_backward_step at 2c236e081) keeps `out` in scope
// across (local_loss * dp).backward(), and its MaskedCrossEntropy computes
// on a view of it. Its recipes do not chunk the loss (Recipe.Validate).
func (s *stepBuilder) holdsLogits() bool { return s.o.AutoModel.On && s.o.LossChunks <= 1 }

// freeHeldLogits emits, at the end of a micro-step's backward, the free of
// the logits the trainer held (holdsLogits).
func (s *stepBuilder) freeHeldLogits() {
	if s.holdsLogits() {
		s.free(s.cfg.LayerHead(), "logits", s.T*s.V*s.o.Precision.Activation.Bytes(), CatLoss)
	}
}

// lossForward emits the head's logits and cross-entropy. Eager (logProbs)
// the log-probabilities are saved; compiled, the logits themselves (with
// the log-sum-exp: Saved's compiled table) are what the loss keeps, so
// nothing else vocabulary-sized is allocated. With LossChunks > 1 each
// chunk does the same and frees what it kept (the chunk is checkpointed
// and recomputed in backward).
func (s *stepBuilder) lossForward(layer int) {
	act := s.o.Precision.Activation.Bytes()
	if s.o.LossChunks <= 1 {
		if s.sh.Compile.Loss || s.sh.TE.Loss {
			s.allocRecords(s.lossSavedSet(), CatActivations)
			return
		}
		s.logProbs(layer, "", s.T*s.V, func() { s.allocRecords(s.lossSavedSet(), CatActivations) })
		return
	}
	for l, tokens := range s.lossChunks() {
		n := tokens * s.V
		if s.sh.Compile.Loss {
			s.alloc(layer, "logits"+l, n*act, CatLoss)
			s.free(layer, "logits"+l, n*act, CatLoss)
			continue
		}
		s.logProbs(layer, l, n, func() { s.alloc(layer, "log_probs"+l, n*s.lossBytes(), CatLoss) })
		s.free(layer, "log_probs"+l, n*s.lossBytes(), CatLoss)
	}
}

// lossBackward emits the gradients of the loss (lossGrads, or compiled
// lossGradsCompiled). Chunked, each chunk first recomputes its forward.
func (s *stepBuilder) lossBackward(layer int) {
	act := s.o.Precision.Activation.Bytes()
	if s.o.LossChunks <= 1 {
		free := func() { s.freeRecords(s.lossSavedSet(), CatActivations) }
		if s.sh.TE.Loss { // the saved logits hold the gradient (te.go, teLoss)
			free()
			return
		}
		if s.sh.Compile.Loss {
			s.lossGradsCompiled(layer, "", s.T*s.V, free)
			return
		}
		s.lossGrads(layer, "", s.T*s.V, free)
		return
	}
	for l, tokens := range s.lossChunks() {
		n := tokens * s.V
		if s.sh.Compile.Loss {
			s.alloc(layer, "logits_bwd"+l, n*act, CatLoss)
			s.lossGradsCompiled(layer, l, n, func() { s.free(layer, "logits_bwd"+l, n*act, CatLoss) })
			continue
		}
		s.logProbs(layer, "_bwd"+l, n, func() { s.alloc(layer, "log_probs_bwd"+l, n*s.lossBytes(), CatLoss) })
		s.lossGrads(layer, l, n, func() { s.free(layer, "log_probs_bwd"+l, n*s.lossBytes(), CatLoss) })
	}
}

// lossGrads emits, for n = tokens × V elements, nll_loss's gradient and
// log_softmax's input gradient (both in the loss type), the free of the
// log-probabilities (freeLogProbs: backward has read them) and, when the
// loss upcast, the cast of the gradient to the activation type for the LM
// head.
func (s *stepBuilder) lossGrads(layer int, suffix string, n int64, freeLogProbs func()) {
	act, lb := s.o.Precision.Activation.Bytes(), s.lossBytes()
	grad := "grad_logits" + suffix
	if s.upcast() {
		grad = "grad_logits_f32" + suffix
	}
	s.alloc(layer, "grad_log_probs"+suffix, n*lb, CatLoss)
	s.alloc(layer, grad, n*lb, CatLoss)
	s.free(layer, "grad_log_probs"+suffix, n*lb, CatLoss)
	freeLogProbs()
	if s.upcast() {
		s.alloc(layer, "grad_logits"+suffix, n*act, CatLoss)
		s.free(layer, grad, n*lb, CatLoss)
		s.free(layer, "grad_logits"+suffix, n*act, CatLoss)
		return
	}
	s.free(layer, grad, n*lb, CatLoss)
}

// lossGradsCompiled emits a compiled loss's backward over n elements: one
// fused kernel writes the logits' gradient in the activation type while the
// saved logits are live; then they are freed (freeSaved), and the gradient
// once the LM head's backward has read it.
func (s *stepBuilder) lossGradsCompiled(layer int, suffix string, n int64, freeSaved func()) {
	act := s.o.Precision.Activation.Bytes()
	s.alloc(layer, "grad_logits"+suffix, n*act, CatLoss)
	freeSaved()
	s.free(layer, "grad_logits"+suffix, n*act, CatLoss)
}
