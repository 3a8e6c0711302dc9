package imagestore_test

import (
	"context"

	"github.com/imgctx/imgctx/blob"
	"github.com/imgctx/imgctx/imagestore"
)

// Put stores data under its ref, as the engine does.
func Put(ctx context.Context, s imagestore.Store, tenant string, data []byte) (blob.Ref, error) {
	ref := blob.Of(data)
	return ref, imagestore.PutComputed(ctx, s, tenant, ref, data)
}
