/* Scales shared by the synthetic-model writer (synth.c) and its routing
 * pieces (synth_routing.c); see synth.h and docs/mkmodel.md for why. */
#ifndef TM_MODEL_SYNTH_CONSTS_H
#define TM_MODEL_SYNTH_CONSTS_H

#define SYNTH_EMBD_STD     1.0f  /* token embedding */
#define SYNTH_BIAS_CHANNEL 0     /* embedding dimension that carries the router bias */
#define SYNTH_BIAS_BETA    2.0f  /* its constant value in every token embedding */
#define SYNTH_ROUTER_NOISE 1.0f  /* std of a router logit over random tokens */
#define SYNTH_ATTN_OUT_STD 0.03f /* std of one layer's attention contribution per dimension */
#define SYNTH_FFN_OUT_STD  0.05f /* std of one expert's output per dimension */
#define SYNTH_SWIGLU_STD   0.6f  /* std of silu(g)*u for g, u ~ N(0, 1) (numerically ~0.59) */
#define SYNTH_ZIPF_CAP     0.9   /* no expert is chosen by more than 90% of tokens */
/* gpt-oss: rms of the clamped SwiGLU g sigmoid(1.702 g) (u + 1) for g, u ~ N(0, 1)
 * (numerically 0.919); biases and sinks small next to what they are added to */
#define SYNTH_SWIGLU_OAI_RMS 0.92f
#define SYNTH_BIAS_STD       0.02f
#define SYNTH_SINK_STD       0.5f
/* attn_q_norm / attn_k_norm of the recency head's layer: the head's logit at
 * distance 0 is gain^2 sqrt(head_dim) (22.6 at 128), so a context of 10^5
 * tokens leaks under 1% of the attention beyond the kernel */
#define SYNTH_LOC_QK_GAIN 1.41421356f
/* the recency head's gate rows (gated attention): gate = w * rmsnorm(x)[bias channel]
 * ~ 4 * 2 = 8, sigmoid(8) = 0.9997: the gate is open and the same for every token */
#define SYNTH_LOC_GATE_W 4.0f

/* qwen3next / qwen35moe. Linear attention's decay e^g, g = ssm_a softplus(alpha + dt):
 * -ssm_a log-uniform in [LO, HI], alpha of std GATE_LOGIT_STD, dt of std DT_STD, so
 * softplus is ~0.3-1.4 and e^g ~0.3-0.99, the range of trained models' decays;
 * beta = sigmoid(b) with b of std GATE_LOGIT_STD: mostly 0.25-0.75 */
#define SYNTH_SSM_A_LO       0.02f
#define SYNTH_SSM_A_HI       0.8f
#define SYNTH_GATE_LOGIT_STD 0.6f
#define SYNTH_DT_STD         0.1f
#define SYNTH_SILU_RMS       0.6f /* rms of silu(z) for z ~ N(0, 1) (numerically 0.596) */

#endif
