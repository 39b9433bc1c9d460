// Worked example (cpu backend): out = alpha * a + beta * b (float32, contiguous).
// Kernel files include no torch header. The launcher is extern "C" and takes raw pointers.
extern "C" int example_axpby_launch(float* out, const float* a, const float* b, float alpha,
                                    float beta, long n) {
  for (long i = 0; i < n; ++i) out[i] = alpha * a[i] + beta * b[i];
  return 0;
}
