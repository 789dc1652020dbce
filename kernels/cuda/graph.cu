/*
** graph.cu — CUDA graphs: the ops queued on a context between
** ds_cuda_capture_begin and ds_cuda_capture_end are recorded (not run) and
** instantiated once; ds_cuda_graph_launch replays all of them with one
** launch. A decode pass is ~170 small kernels whose launch cost, not the GPU,
** bounds one stream; replayed as a graph they start back to back.
**
** Owns: the instantiated graph (cudaGraphExec_t) behind struct ds_cuda_graph.
*/
#include <cstdlib>

#include "common.cuh"

struct ds_cuda_graph {
    cudaGraphExec_t exec;
};

enum ds_err ds_cuda_capture_begin(struct ds_cuda *cu)
{
    if (!cu) return DS_ERR_INVAL;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    /* Thread-local: other threads' CUDA calls (another context's uploads)
    ** neither break this recording nor are refused while it lasts. */
    DS_CUDA_CHECK(cudaStreamBeginCapture(cu->stream, cudaStreamCaptureModeThreadLocal));
    return DS_OK;
}

enum ds_err ds_cuda_capture_end(struct ds_cuda *cu, struct ds_cuda_graph **out)
{
    if (!cu || !out) return DS_ERR_INVAL;
    *out = NULL;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    cudaGraph_t graph = NULL;
    /* Always ends the recording, also when an op inside it failed (then the
    ** capture is invalidated and graph is NULL): the stream runs ops again. */
    if ((rc = DS_CUDA_ERR(cudaStreamEndCapture(cu->stream, &graph))) != DS_OK) return rc;
    if (!graph) return DS_ERR_IO;
    struct ds_cuda_graph *g = (struct ds_cuda_graph *)calloc(1, sizeof *g);
    if (!g) rc = DS_ERR_NOMEM;
    if (rc == DS_OK) rc = DS_CUDA_ERR(cudaGraphInstantiate(&g->exec, graph, 0));
    (void)DS_CUDA_ERR(cudaGraphDestroy(graph));          /* the instance keeps what it needs */
    if (rc != DS_OK) {
        free(g);
        return rc;
    }
    *out = g;
    return DS_OK;
}

enum ds_err ds_cuda_graph_launch(struct ds_cuda *cu, const struct ds_cuda_graph *g)
{
    if (!cu || !g) return DS_ERR_INVAL;
    enum ds_err rc = ds_cuda__use(cu);
    if (rc != DS_OK) return rc;
    DS_CUDA_CHECK(cudaGraphLaunch(g->exec, cu->stream));
    return DS_OK;
}

void ds_cuda_graph_destroy(struct ds_cuda *cu, struct ds_cuda_graph *g)
{
    if (!g) return;
    if (cu && ds_cuda__use(cu) == DS_OK)
        (void)DS_CUDA_ERR(cudaStreamSynchronize(cu->stream));   /* a replay may still run */
    (void)DS_CUDA_ERR(cudaGraphExecDestroy(g->exec));
    free(g);
}
