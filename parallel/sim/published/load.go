package published

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moescope/moescope/internal/fileio"
	"github.com/moescope/moescope/moe"
	"github.com/moescope/moescope/moe/hf"
)

// Load reads every *.json file directly in dir (sorted by name)
// as an array of runs with sources. A model given as a relative path is
// made relative to dir.
func Load(dir string) ([]Run, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	open := func(p string) (io.ReadCloser, error) { return os.Open(p) }
	return loadFiles(paths, open, func(m string) string { return filepath.Join(dir, m) }, nil)
}

// LoadFS is Load for the folder dir of fsys (the runs embedded in the
// binary): paths are fsys's, and a model given as a relative path is read
// from fsys (LoadModel), relative to dir.
func LoadFS(fsys fs.FS, dir string) ([]Run, error) {
	paths, err := fs.Glob(fsys, path.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	open := func(p string) (io.ReadCloser, error) { return fsys.Open(p) }
	return loadFiles(paths, open, func(m string) string { return path.Join(dir, m) }, fsys)
}

// loadFiles reads the runs files at paths, in name order, with sources
// required, names each relative model path by join and records models as
// the file system it is read from (nil: the disk); then refuses runs
// recorded twice.
func loadFiles(paths []string, open func(string) (io.ReadCloser, error), join func(string) string, models fs.FS) ([]Run, error) {
	sort.Strings(paths)
	var all []Run
	for _, p := range paths {
		f, err := open(p)
		if err != nil {
			return nil, err
		}
		runs, err := ReadRuns(f, p, true)
		f.Close()
		if err != nil {
			return nil, err
		}
		for i := range runs {
			if relativeModel(runs[i].Model) {
				runs[i].Model = join(runs[i].Model)
				runs[i].models = models
			}
		}
		all = append(all, runs...)
	}
	if err := CheckDuplicates(all); err != nil {
		return nil, err
	}
	return all, nil
}

// ReadFile reads one runs file from disk, as `calibrate --runs` and
// `validate --runs` take it: a regular file (ReadRuns: source required
// when requireSource), a model given as a relative path made relative to
// the file's folder.
func ReadFile(file string, requireSource bool) ([]Run, error) {
	f, err := fileio.OpenRegular(file)
	if err != nil {
		return nil, err
	}
	runs, err := ReadRuns(f, file, requireSource)
	f.Close()
	if err != nil {
		return nil, err
	}
	dir := filepath.Dir(file)
	for i := range runs {
		if relativeModel(runs[i].Model) {
			runs[i].Model = filepath.Join(dir, runs[i].Model)
		}
	}
	return runs, nil
}

// relativeModel says whether a run's model names a config.json by a path
// relative to the runs file: a name without a separator is a built-in
// (or, as hf.Load reads it, a file in the working directory).
func relativeModel(m string) bool {
	return strings.ContainsAny(m, `/\`) && !filepath.IsAbs(m)
}

// maxModelBytes bounds a config.json read from a runs file's file system,
// as hf.Load bounds one read from disk: real ones are a few KiB.
const maxModelBytes = 1 << 20

// LoadModel returns the run's model: a built-in by name or a config.json
// path, read from the file system the run was loaded from (LoadFS), else
// from disk (hf.Load).
func (r Run) LoadModel() (*moe.Config, error) {
	if r.models == nil {
		return hf.Load(r.Model)
	}
	f, err := r.models.Open(r.Model)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("model %q: no such config.json among the runs' files", r.Model)
		}
		return nil, fmt.Errorf("model %q: %w", r.Model, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxModelBytes+1))
	if err != nil {
		return nil, fmt.Errorf("model %q: %w", r.Model, err)
	}
	if len(data) > maxModelBytes {
		return nil, fmt.Errorf("model %q: larger than %d bytes: not a config.json", r.Model, maxModelBytes)
	}
	return hf.ParseConfig(data, r.Model)
}
