package job

import (
	"errors"
	"fmt"

	"github.com/moescope/moescope/moe"
)

// Spec is the one description of a training run: the model, the layout
// its ranks form, the batch, the checkpointing policy and the recipe it
// executes with. Every package that counts, sizes, times or executes a run
// takes a Spec (plus what is truly its own: a device, a calibration, an
// allocator model), and every command fills one from its flags.
//
// Its JSON form is flat, as DESIGN's published-runs schema writes a run:
// the layout's, the batch's and the recipe's keys side by side with "ac"
// (the model is named by whoever reads the file).
type Spec struct {
	Model *moe.Config `json:"-"`
	Layout
	Batch
	AC moe.AC `json:"ac"`
	Recipe
}

// DefaultSpec is a one-GPU run of cfg with torchtitan's defaults:
// selective checkpointing, one micro-step and DefaultRecipe (lbs and seq
// are the caller's).
func DefaultSpec(cfg *moe.Config) Spec {
	return Spec{Model: cfg, Layout: DefaultLayout(), Batch: Batch{GradAccum: 1}, AC: moe.AC{Mode: moe.ACSelective}, Recipe: DefaultRecipe()}
}

// Resolve fills the defaults of the layout and the recipe (Layout.Resolve,
// Recipe.Resolve, grad_accum 0 = 1) and validates the whole run: each part,
// the layout against the model (Layout.CheckModel) and the sequence length
// against the layout (Layout.CheckSeq). Under pipeline parallelism the local
// batch must split into micro-batches (Layout.Microbatches).
func (s *Spec) Resolve() error {
	if s.Model == nil {
		return errors.New("run: model is required")
	}
	if err := s.Model.Validate(); err != nil {
		return err
	}
	if s.GradAccum == 0 {
		s.GradAccum = 1
	}
	var errs []error
	for _, err := range []error{s.Layout.Resolve(), s.Batch.Validate(), s.AC.Validate(), s.Recipe.Resolve()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return s.check()
}

// Validate checks a resolved Spec without filling anything.
func (s Spec) Validate() error {
	if s.Model == nil {
		return errors.New("run: model is required")
	}
	var errs []error
	for _, err := range []error{s.Model.Validate(), s.Layout.Validate(), s.Batch.Validate(), s.AC.Validate(), s.Recipe.Validate()} {
		if err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	return s.check()
}

// check holds the rules that join two parts of a run.
func (s Spec) check() error {
	if err := s.Layout.CheckModel(s.Model); err != nil {
		return err
	}
	if err := s.Layout.CheckSeq(s.Seq); err != nil {
		return err
	}
	if s.Stages() > 1 {
		if _, err := s.Layout.Microbatches(s.LBS); err != nil {
			return err
		}
	}
	return nil
}

// MaxExpertSkew is the largest ExpertSkew the run's layout allows: the
// most loaded expert-parallel rank receives at most min(top-k, experts/ep)
// of a token's top-k rows, so at most ep·min(k, E/ep)/k × the mean (1
// without routed experts or expert parallelism).
func (s Spec) MaxExpertSkew() float64 {
	cfg := s.Model
	if !cfg.IsMoE() {
		return 1
	}
	return float64(s.EP*min(cfg.TopK, cfg.Experts/s.EP)) / float64(cfg.TopK)
}

// CheckExpertSkew refuses an expert skew the layout cannot produce (above
// MaxExpertSkew).
func (s Spec) CheckExpertSkew() error {
	if maxSkew := max(s.MaxExpertSkew(), 1); s.ExpertSkew > 1 && s.ExpertSkew > maxSkew {
		return fmt.Errorf("expert skew = %v: must be in [1, %v] for ep = %d, top-k %d of %d experts (the most loaded EP rank receives at most min(top-k, experts/ep) rows per token)",
			s.ExpertSkew, maxSkew, s.EP, s.Model.TopK, s.Model.Experts)
	}
	return nil
}

// GlobalBatch is the sequences one optimizer step consumes.
func (s Spec) GlobalBatch() int64 { return s.Batch.Global(s.Layout.DP()) }

// String is the run in one line, for messages and plan listings.
func (s Spec) String() string {
	return fmt.Sprintf("%s ac=%s lbs=%d grad_accum=%d", s.Layout.Label(), s.AC, s.LBS, s.Accum())
}
