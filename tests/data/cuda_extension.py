"""Compile and link a small CUDA C++ extension against the image's torch (no GPU needed)."""

from torch.utils.cpp_extension import load_inline

CUDA = r"""
__global__ void add_one_kernel(float* x, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
torch::Tensor add_one(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat, "a float CUDA tensor");
    long n = x.numel();
    add_one_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), n);
    return x;
}
"""

module = load_inline(
    name="imagebuilder_probe",
    cpp_sources="torch::Tensor add_one(torch::Tensor x);",
    cuda_sources=CUDA,
    functions=["add_one"],
    verbose=True,
)
print("extension built:", module.add_one.__doc__ is not None)
