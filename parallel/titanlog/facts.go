package titanlog

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/moescope/moescope/parallel/plan"
)

// ErrMismatch marks a log that does not match the job config given for
// it (or the config it printed): the user named the wrong file.
var ErrMismatch = errors.New("the log and its job config disagree")

// Facts are what torchtitan's start-up lines state about the run, each
// with the 1-based line it was read from (0: the log has no such line).
type Facts struct {
	// Trainer.__init__'s summary. v0.2.2 (torchtitan/train.py at 73a0e69,
	// lines 354–362) prints `Trainer is initialized with local batch size
	// {local_batch_size}, global batch size {global_batch_size}, gradient
	// accumulation steps {n}, sequence length {seq_len}, total steps …`,
	// the global batch after -1 is resolved (lines 195–213); main
	// (torchtitan/trainer.py at b5bcd76, lines 621–629) prints `… with
	// {num_tokens_per_dp_rank} tokens per DP rank, {num_tokens_per_train_step}
	// tokens per train step, gradient accumulation steps {n}, maximum
	// context length {max_context_length}, total steps …`, where tokens
	// per DP rank is num_tokens_per_microbatch_per_dp_rank × the pipeline
	// microbatches (1 without pipeline parallelism, lines 409–428).
	TrainerLine                    int
	TrainerMain                    bool // main's token-counted form
	LBS, GlobalBatch, Seq, Accum   int  // Seq: seq_len (v0.2.2) or max_context_length (main)
	TokensPerDPRank, TokensPerStep int  // main only
	// ParallelDims.build_mesh's `Building device mesh with parallelism:
	// pp=…, dp_replicate=…, dp_shard=…, cp=…, tp=…, ep=…` (v0.2.2
	// torchtitan/distributed/parallel_dims.py lines 130–134, which adds
	// `, etp=…`; main lines 274–278). dp_shard is printed after
	// _validate resolves -1 to the rest of the world, and _validate asserts
	// dp_replicate × dp_shard × cp × tp × pp = WORLD_SIZE: the product is
	// the GPU count.
	MeshLine                                  int
	PP, DPReplicate, DPShard, CP, TP, EP, ETP int // ETP -1: not printed (main)
	// `Model {name} {flavor} size: {count:,} total parameters`, coloured
	// (train.py lines 174–177 at 73a0e69, trainer.py lines 388–391 at b5bcd76).
	ModelLine         int
	ModelName, Flavor string
}

var (
	trainerV022RE = regexp.MustCompile(`^Trainer is initialized with local batch size (\d+), global batch size (\d+), ` +
		`gradient accumulation steps (\d+), sequence length (\d+), total steps`)
	trainerMainRE = regexp.MustCompile(`^Trainer is initialized with (\d+) tokens per DP rank, (\d+) tokens per train step, ` +
		`gradient accumulation steps (\d+), maximum context length (\d+), total steps`)
	meshRE = regexp.MustCompile(`^Building device mesh with parallelism: pp=(\d+), dp_replicate=(\d+), dp_shard=(\d+), ` +
		`cp=(\d+), tp=(\d+), ep=(\d+)(?:, etp=(\d+))?\s*$`)
	modelRE = regexp.MustCompile(`^Model (\S+) (\S+) size: [\d,]+ total parameters\s*$`)
)

// readFact reads msg (line no) into lg.Facts when it is one of the lines
// Facts describes, and reports whether it was. A second line of the same
// kind is an error: two runs in one file.
func (lg *Log) readFact(no int, msg string) (bool, error) {
	f := &lg.Facts
	var at *int
	var what string
	if m := trainerV022RE.FindStringSubmatch(msg); m != nil {
		at, what = &f.TrainerLine, "`Trainer is initialized with …`"
		f.LBS, f.GlobalBatch, f.Accum, f.Seq = atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4])
	} else if m := trainerMainRE.FindStringSubmatch(msg); m != nil {
		at, what = &f.TrainerLine, "`Trainer is initialized with …`"
		f.TrainerMain = true
		f.TokensPerDPRank, f.TokensPerStep, f.Accum, f.Seq = atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4])
	} else if m := meshRE.FindStringSubmatch(msg); m != nil {
		at, what = &f.MeshLine, "`Building device mesh with parallelism: …`"
		f.PP, f.DPReplicate, f.DPShard, f.CP, f.TP, f.EP = atoi(m[1]), atoi(m[2]), atoi(m[3]), atoi(m[4]), atoi(m[5]), atoi(m[6])
		f.ETP = -1
		if m[7] != "" {
			f.ETP = atoi(m[7])
		}
	} else if m := modelRE.FindStringSubmatch(msg); m != nil {
		at, what = &f.ModelLine, "`Model … size: …`"
		f.ModelName, f.Flavor = m[1], m[2]
	} else {
		return false, nil
	}
	if *at != 0 {
		return true, fmt.Errorf("%s: line %d: a second %s line (the first at line %d): two runs in one log? give each its own file", lg.Name, no, what, *at)
	}
	*at = no
	return true, nil
}

// atoi reads a run of digits a pattern matched; one too long for an int
// reads as -1, which no config's value equals.
func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return n
}

// checkFacts compares what the log states (Facts) with job, the job
// config the run is read with, and reports every field that differs,
// naming the log, the job config and both values. A job whose
// data_parallel_shard_degree is -1 (the rest of the world) takes the
// degree the log states; the returned job is then a copy.
func (lg *Log) checkFacts(job *Job) (*Job, error) {
	f := &lg.Facts
	type field struct {
		name     string
		log, cfg any
		line     int
	}
	if f.MeshLine > 0 && job.DPShard == -1 {
		j := *job
		j.DPShard = f.DPShard
		j.Where = fmt.Sprintf("%s (data_parallel_shard_degree -1, %d as %s line %d states)", job.Where, f.DPShard, lg.Name, f.MeshLine)
		job = &j
	}
	var fs []field
	if f.TrainerLine > 0 {
		// The default global batch (0: lbs × the data-parallel degree) is
		// unknown while dp_shard is -1; so is the accumulation.
		known := job.DPShard > 0 || job.GlobalBatch > 0
		seq := job.Seq
		if f.TrainerMain {
			fs = append(fs, field{"tokens per DP rank (num_tokens_per_microbatch_per_dp_rank)", f.TokensPerDPRank, job.LBS * seq, f.TrainerLine})
			if known {
				fs = append(fs, field{"tokens per train step (num_tokens_per_train_step)", f.TokensPerStep, job.globalBatch() * seq, f.TrainerLine})
			}
			fs = append(fs, field{"maximum context length", f.Seq, seq, f.TrainerLine})
		} else {
			fs = append(fs, field{"local batch size", f.LBS, job.LBS, f.TrainerLine})
			if known {
				fs = append(fs, field{"global batch size", f.GlobalBatch, job.globalBatch(), f.TrainerLine})
			}
			fs = append(fs, field{"sequence length", f.Seq, seq, f.TrainerLine})
		}
		if dp := job.DPShard * job.DPReplicate; job.DPShard > 0 && job.LBS > 0 && job.globalBatch()%(job.LBS*dp) == 0 {
			fs = append(fs, field{"gradient accumulation steps", f.Accum, job.globalBatch() / (job.LBS * dp), f.TrainerLine})
		}
	}
	if f.MeshLine > 0 {
		fs = append(fs,
			field{"GPU count (the product of the mesh degrees)", f.PP * f.DPReplicate * f.DPShard * f.CP * f.TP, job.PP * job.DPReplicate * job.DPShard * job.CP * job.TP, f.MeshLine},
			field{"pipeline_parallel_degree", f.PP, job.PP, f.MeshLine},
			field{"data_parallel_replicate_degree", f.DPReplicate, job.DPReplicate, f.MeshLine},
			field{"data_parallel_shard_degree", f.DPShard, job.DPShard, f.MeshLine},
			field{"context_parallel_degree", f.CP, job.CP, f.MeshLine},
			field{"tensor_parallel_degree", f.TP, job.TP, f.MeshLine},
			field{"expert_parallel_degree", f.EP, job.EP, f.MeshLine})
		if f.ETP >= 0 && job.Form == FormTOML {
			fs = append(fs, field{"expert_tensor_parallel_degree", f.ETP, job.ETP, f.MeshLine})
		}
	}
	if f.ModelLine > 0 {
		if m, err := plan.TorchtitanModelFor(f.ModelName, f.Flavor); err != nil || m != job.Model {
			if err != nil {
				m = "no moescope model"
			}
			fs = append(fs, field{"model", fmt.Sprintf("%s %s (%s)", f.ModelName, f.Flavor, m), job.Model, f.ModelLine})
		}
	}
	var errs []string
	for _, x := range fs {
		if x.log != x.cfg {
			errs = append(errs, fmt.Sprintf("%s: %v in %s (line %d), %v in %s", x.name, x.log, lg.Name, x.line, x.cfg, job.Where))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: log %s, job config %s (was the log made with another config? give the configs in the logs' order):\n  %s",
			ErrMismatch, lg.Name, job.Where, strings.Join(errs, "\n  "))
	}
	return job, nil
}
