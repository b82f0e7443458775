"""The real tasks' prompt templates (constants; ``platonic_jax.data.registry`` pairs them with
class names in each task's spec): CLIP's prompt-engineering lists for the image tasks, the
RESISC45 remote-sensing list for UCMerced and AID too (our choice: they have no standard list),
the CLAP zero-shot prompts for audio, and a few prompts per DomainNet domain (our choice). Each
template holds exactly one ``{}``, where the class name goes.
"""

MNIST_TEMPLATES = ('a photo of the number: "{}".',)

EUROSAT_TEMPLATES = (
    "a centered satellite photo of {}.",
    "a centered satellite photo of a {}.",
    "a centered satellite photo of the {}.",
)

GTSRB_TEMPLATES = (
    'a zoomed in photo of a "{}" traffic sign.',
    'a centered photo of a "{}" traffic sign.',
    'a close up photo of a "{}" traffic sign.',
)

DTD_TEMPLATES = (
    "a photo of a {} texture.",
    "a photo of a {} pattern.",
    "a photo of a {} thing.",
    "a photo of a {} object.",
    "a photo of the {} texture.",
    "a photo of the {} pattern.",
    "a photo of the {} thing.",
    "a photo of the {} object.",
)

CARS_TEMPLATES = (
    "a photo of a {}.",
    "a photo of the {}.",
    "a photo of my {}.",
    "i love my {}!",
    "a photo of my dirty {}.",
    "a photo of my clean {}.",
    "a photo of my new {}.",
    "a photo of my old {}.",
)

SUN397_TEMPLATES = ("a photo of a {}.", "a photo of the {}.")

REMOTE_SENSING_TEMPLATES = (
    "satellite imagery of {}.",
    "aerial imagery of {}.",
    "satellite photo of {}.",
    "aerial photo of {}.",
    "satellite view of {}.",
    "aerial view of {}.",
    "satellite imagery of a {}.",
    "aerial imagery of a {}.",
    "satellite photo of a {}.",
    "aerial photo of a {}.",
    "satellite view of a {}.",
    "aerial view of a {}.",
    "satellite imagery of the {}.",
    "aerial imagery of the {}.",
    "satellite photo of the {}.",
    "aerial photo of the {}.",
    "satellite view of the {}.",
    "aerial view of the {}.",
)

CIFAR_TEMPLATES = (
    "a photo of a {}.",
    "a blurry photo of a {}.",
    "a black and white photo of a {}.",
    "a low contrast photo of a {}.",
    "a high contrast photo of a {}.",
    "a bad photo of a {}.",
    "a good photo of a {}.",
    "a photo of a small {}.",
    "a photo of a big {}.",
    "a photo of the {}.",
    "a blurry photo of the {}.",
    "a black and white photo of the {}.",
    "a low contrast photo of the {}.",
    "a high contrast photo of the {}.",
    "a bad photo of the {}.",
    "a good photo of the {}.",
    "a photo of the small {}.",
    "a photo of the big {}.",
)

IMAGENET_TEMPLATES = (
    "a bad photo of a {}.",
    "a photo of many {}.",
    "a sculpture of a {}.",
    "a photo of the hard to see {}.",
    "a low resolution photo of the {}.",
    "a rendering of a {}.",
    "graffiti of a {}.",
    "a bad photo of the {}.",
    "a cropped photo of the {}.",
    "a tattoo of a {}.",
    "the embroidered {}.",
    "a photo of a hard to see {}.",
    "a bright photo of a {}.",
    "a photo of a clean {}.",
    "a photo of a dirty {}.",
    "a dark photo of the {}.",
    "a drawing of a {}.",
    "a photo of my {}.",
    "the plastic {}.",
    "a photo of the cool {}.",
    "a close-up photo of a {}.",
    "a black and white photo of the {}.",
    "a painting of the {}.",
    "a painting of a {}.",
    "a pixelated photo of the {}.",
    "a sculpture of the {}.",
    "a bright photo of the {}.",
    "a cropped photo of a {}.",
    "a plastic {}.",
    "a photo of the dirty {}.",
    "a jpeg corrupted photo of a {}.",
    "a blurry photo of the {}.",
    "a photo of the {}.",
    "a good photo of the {}.",
    "a rendering of the {}.",
    "a {} in a video game.",
    "a photo of one {}.",
    "a doodle of a {}.",
    "a close-up photo of the {}.",
    "a photo of a {}.",
    "the origami {}.",
    "the {} in a video game.",
    "a sketch of a {}.",
    "a doodle of the {}.",
    "a origami {}.",
    "a low resolution photo of a {}.",
    "the toy {}.",
    "a rendition of the {}.",
    "a photo of the clean {}.",
    "a photo of a large {}.",
    "a rendition of a {}.",
    "a photo of a nice {}.",
    "a photo of a weird {}.",
    "a blurry photo of a {}.",
    "a cartoon {}.",
    "art of a {}.",
    "a sketch of the {}.",
    "a embroidered {}.",
    "a pixelated photo of a {}.",
    "itap of the {}.",
    "a jpeg corrupted photo of the {}.",
    "a good photo of a {}.",
    "a plushie {}.",
    "a photo of the nice {}.",
    "a photo of the small {}.",
    "a photo of the weird {}.",
    "the cartoon {}.",
    "art of the {}.",
    "a drawing of the {}.",
    "a photo of the large {}.",
    "a black and white photo of a {}.",
    "the plushie {}.",
    "a dark photo of a {}.",
    "itap of a {}.",
    "graffiti of the {}.",
    "a toy {}.",
    "itap of my {}.",
    "a photo of a cool {}.",
    "a photo of a small {}.",
    "a tattoo of the {}.",
)

SOUND_TEMPLATES = ("This is a sound of {}.",)
MUSIC_TEMPLATES = ("This audio is a {} song.",)

# DomainNet: a few CLIP-style prompts per domain (our choice; there is no standard list), each
# naming the domain's rendering so that the two domains of an analogy product get distinct
# prompts over the same classes.
DOMAINNET_TEMPLATES = {
    "real": (
        "a photo of a {}.",
        "a photo of the {}.",
        "a good photo of a {}.",
        "a close-up photo of a {}.",
    ),
    "sketch": (
        "a sketch of a {}.",
        "a sketch of the {}.",
        "a pencil sketch of a {}.",
        "a black and white sketch of a {}.",
    ),
    "clipart": (
        "a clipart of a {}.",
        "a clipart of the {}.",
        "a clip art image of a {}.",
        "a cartoon illustration of a {}.",
    ),
    "painting": (
        "a painting of a {}.",
        "a painting of the {}.",
        "an oil painting of a {}.",
        "art of a {}.",
    ),
    "quickdraw": (
        "a doodle of a {}.",
        "a doodle of the {}.",
        "a quick drawing of a {}.",
        "a simple line drawing of a {}.",
    ),
    "infograph": (
        "an infographic of a {}.",
        "an infographic of the {}.",
        "an infographic about a {}.",
        "an information graphic with a {}.",
    ),
}
