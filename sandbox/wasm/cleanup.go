package wasm

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// CleanupCache removes what a process killed while writing the compilation
// cache left under cacheDir/wazero: wazero writes each compiled module to a
// temporary NAME.*.tmp and renames it into place, so a .tmp older than
// olderThan is a leftover. Compiled modules are the cache and stay. An
// episode's own state is in memory only and dies with its process: there is
// nothing else of the WASM backend's to clean.
func CleanupCache(cacheDir string, olderThan time.Duration) ([]string, error) {
	root := filepath.Join(cacheDir, "wazero")
	var removed []string
	var errs []error
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".tmp") {
			return nil
		}
		info, err := d.Info()
		if err != nil || time.Since(info.ModTime()) < olderThan {
			return nil
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			return nil
		}
		removed = append(removed, p)
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}
