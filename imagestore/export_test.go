package imagestore

// SetBeforeRename exposes the crash hook to the external test package.
func SetBeforeRename(f *FS, fn func() error) { f.beforeRename = fn }
