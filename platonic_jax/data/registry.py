"""The real tasks: class names, prompt templates, split names, and the probe rule.

| task          | modality | classes | templates             | on-disk class folders            |
|---------------|----------|---------|-----------------------|----------------------------------|
| eurosat       | image    | 10      | CLIP's (3)            | AnnualCrop, ..., SeaLake         |
| dtd           | image    | 47      | CLIP's (8)            | the class names                  |
| cars          | image    | 196     | CLIP's (8)            | the class names                  |
| gtsrb         | image    | 43      | CLIP's (3)            | 00000 ... 00042                  |
| mnist         | image    | 10      | CLIP's (1)            | 0 ... 9                          |
| resisc45      | image    | 45      | CLIP's (18)           | airplane, ..., wetland           |
| svhn          | image    | 10      | CLIP's (1)            | 0 ... 9                          |
| sun397        | image    | 397     | CLIP's (2)            | abbey, ..., youth_hostel         |
| cifar100      | image    | 100     | CLIP's (18)           | apple, aquarium_fish, ...        |
| imagenet      | image    | 1000    | CLIP's (80)           | 1000 WordNet ids, sorted         |
| ucmerced      | image    | 21      | remote sensing (18)   | agricultural, ..., tenniscourt   |
| aid           | image    | 30      | remote sensing (18)   | Airport, ..., Viaduct            |
| esc50         | audio    | 50      | CLAP's (1)            | dog, ..., hand_saw               |
| gtzan         | audio    | 10      | CLAP's (1)            | blues, ..., rock                 |
| urbansound8k  | audio    | 10      | CLAP's (1)            | air_conditioner, ..., street_music |
| domainnet_*   | image    | 345     | ours (4 per domain)   | aircraft_carrier, ..., zigzag    |

Class names and templates are the standard zero-shot ones (CLIP's prompt-engineering lists for
the image tasks, including their spellings, so zero-shot numbers compare with published ones);
UCMerced and AID have no standard CLIP list, so they use the RESISC45 remote-sensing templates
(our choice). Audio prompts follow the CLAP zero-shot prompts. DomainNet's six domains
(``domainnet_real``, ``_sketch``, ``_clipart``, ``_painting``, ``_quickdraw``, ``_infograph``)
share its 345 classes (the release's folder names, underscores read as spaces, in the label
order of its split lists); each domain has its own few prompts naming its rendering ("a sketch
of a {}.", our choice, as there is no standard list).

On-disk names are matched to classes by ``folder_key``: lower case, every non-alphanumeric
character dropped, and an all-digit name read as an integer, so ``sea_waves``, ``Sea Waves`` and
``SeaWaves`` all match "sea waves", and ``00007`` matches ``7``. A task's ``folder_names`` (when
given) are matched as well as its class names. ImageNet is the exception: its folders (and the
label names of its Hugging Face copies) are WordNet ids, which this module does not list; the
standard label of a class is the rank of its WordNet id in sorted order, so ImageNet takes any
1000 folder names and maps them by sorted position (``index_by_sorted_folders``).

The probe rule (``probe_indices``): a task's ``n`` unlabeled probes are ``n`` distinct train-split
positions drawn without replacement by ``numpy.random.default_rng(seed)``, returned sorted.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

import numpy as np

from platonic_jax.core.grid import check_templates

IMAGE, AUDIO = "image", "audio"
DEFAULT_SPLITS = {"train": "train", "test": "test"}

# ---- templates -----------------------------------------------------------------------------

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

# ---- class names -----------------------------------------------------------------------------

EUROSAT_CLASSES = (
    "annual crop land", "forest", "brushland or shrubland", "highway or road",
    "industrial buildings or commercial buildings", "pasture land", "permanent crop land",
    "residential buildings or homes or apartments", "river", "lake or sea",
)
EUROSAT_FOLDERS = (
    "AnnualCrop", "Forest", "HerbaceousVegetation", "Highway", "Industrial", "Pasture",
    "PermanentCrop", "Residential", "River", "SeaLake",
)

DTD_CLASSES = (
    "banded", "blotchy", "braided", "bubbly", "bumpy", "chequered", "cobwebbed", "cracked",
    "crosshatched", "crystalline", "dotted", "fibrous", "flecked", "freckled", "frilly", "gauzy",
    "grid", "grooved", "honeycombed", "interlaced", "knitted", "lacelike", "lined", "marbled",
    "matted", "meshed", "paisley", "perforated", "pitted", "pleated", "polka-dotted", "porous",
    "potholed", "scaly", "smeared", "spiralled", "sprinkled", "stained", "stratified", "striped",
    "studded", "swirly", "veined", "waffled", "woven", "wrinkled", "zigzagged",
)

CARS_CLASSES = (
    "AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012",
    "Acura TL Type-S 2008", "Acura TSX Sedan 2012", "Acura Integra Type R 2001",
    "Acura ZDX Hatchback 2012", "Aston Martin V8 Vantage Convertible 2012",
    "Aston Martin V8 Vantage Coupe 2012", "Aston Martin Virage Convertible 2012",
    "Aston Martin Virage Coupe 2012", "Audi RS 4 Convertible 2008", "Audi A5 Coupe 2012",
    "Audi TTS Coupe 2012", "Audi R8 Coupe 2012", "Audi V8 Sedan 1994", "Audi 100 Sedan 1994",
    "Audi 100 Wagon 1994", "Audi TT Hatchback 2011", "Audi S6 Sedan 2011",
    "Audi S5 Convertible 2012", "Audi S5 Coupe 2012", "Audi S4 Sedan 2012", "Audi S4 Sedan 2007",
    "Audi TT RS Coupe 2012", "BMW ActiveHybrid 5 Sedan 2012", "BMW 1 Series Convertible 2012",
    "BMW 1 Series Coupe 2012", "BMW 3 Series Sedan 2012", "BMW 3 Series Wagon 2012",
    "BMW 6 Series Convertible 2007", "BMW X5 SUV 2007", "BMW X6 SUV 2012", "BMW M3 Coupe 2012",
    "BMW M5 Sedan 2010", "BMW M6 Convertible 2010", "BMW X3 SUV 2012", "BMW Z4 Convertible 2012",
    "Bentley Continental Supersports Conv. Convertible 2012", "Bentley Arnage Sedan 2009",
    "Bentley Mulsanne Sedan 2011", "Bentley Continental GT Coupe 2012",
    "Bentley Continental GT Coupe 2007", "Bentley Continental Flying Spur Sedan 2007",
    "Bugatti Veyron 16.4 Convertible 2009", "Bugatti Veyron 16.4 Coupe 2009",
    "Buick Regal GS 2012", "Buick Rainier SUV 2007", "Buick Verano Sedan 2012",
    "Buick Enclave SUV 2012", "Cadillac CTS-V Sedan 2012", "Cadillac SRX SUV 2012",
    "Cadillac Escalade EXT Crew Cab 2007", "Chevrolet Silverado 1500 Hybrid Crew Cab 2012",
    "Chevrolet Corvette Convertible 2012", "Chevrolet Corvette ZR1 2012",
    "Chevrolet Corvette Ron Fellows Edition Z06 2007", "Chevrolet Traverse SUV 2012",
    "Chevrolet Camaro Convertible 2012", "Chevrolet HHR SS 2010", "Chevrolet Impala Sedan 2007",
    "Chevrolet Tahoe Hybrid SUV 2012", "Chevrolet Sonic Sedan 2012",
    "Chevrolet Express Cargo Van 2007", "Chevrolet Avalanche Crew Cab 2012",
    "Chevrolet Cobalt SS 2010", "Chevrolet Malibu Hybrid Sedan 2010",
    "Chevrolet TrailBlazer SS 2009", "Chevrolet Silverado 2500HD Regular Cab 2012",
    "Chevrolet Silverado 1500 Classic Extended Cab 2007", "Chevrolet Express Van 2007",
    "Chevrolet Monte Carlo Coupe 2007", "Chevrolet Malibu Sedan 2007",
    "Chevrolet Silverado 1500 Extended Cab 2012", "Chevrolet Silverado 1500 Regular Cab 2012",
    "Chrysler Aspen SUV 2009", "Chrysler Sebring Convertible 2010",
    "Chrysler Town and Country Minivan 2012", "Chrysler 300 SRT-8 2010",
    "Chrysler Crossfire Convertible 2008", "Chrysler PT Cruiser Convertible 2008",
    "Daewoo Nubira Wagon 2002", "Dodge Caliber Wagon 2012", "Dodge Caliber Wagon 2007",
    "Dodge Caravan Minivan 1997", "Dodge Ram Pickup 3500 Crew Cab 2010",
    "Dodge Ram Pickup 3500 Quad Cab 2009", "Dodge Sprinter Cargo Van 2009",
    "Dodge Journey SUV 2012", "Dodge Dakota Crew Cab 2010", "Dodge Dakota Club Cab 2007",
    "Dodge Magnum Wagon 2008", "Dodge Challenger SRT8 2011", "Dodge Durango SUV 2012",
    "Dodge Durango SUV 2007", "Dodge Charger Sedan 2012", "Dodge Charger SRT-8 2009",
    "Eagle Talon Hatchback 1998", "FIAT 500 Abarth 2012", "FIAT 500 Convertible 2012",
    "Ferrari FF Coupe 2012", "Ferrari California Convertible 2012",
    "Ferrari 458 Italia Convertible 2012", "Ferrari 458 Italia Coupe 2012",
    "Fisker Karma Sedan 2012", "Ford F-450 Super Duty Crew Cab 2012",
    "Ford Mustang Convertible 2007", "Ford Freestar Minivan 2007", "Ford Expedition EL SUV 2009",
    "Ford Edge SUV 2012", "Ford Ranger SuperCab 2011", "Ford GT Coupe 2006",
    "Ford F-150 Regular Cab 2012", "Ford F-150 Regular Cab 2007", "Ford Focus Sedan 2007",
    "Ford E-Series Wagon Van 2012", "Ford Fiesta Sedan 2012", "GMC Terrain SUV 2012",
    "GMC Savana Van 2012", "GMC Yukon Hybrid SUV 2012", "GMC Acadia SUV 2012",
    "GMC Canyon Extended Cab 2012", "Geo Metro Convertible 1993", "HUMMER H3T Crew Cab 2010",
    "HUMMER H2 SUT Crew Cab 2009", "Honda Odyssey Minivan 2012", "Honda Odyssey Minivan 2007",
    "Honda Accord Coupe 2012", "Honda Accord Sedan 2012", "Hyundai Veloster Hatchback 2012",
    "Hyundai Santa Fe SUV 2012", "Hyundai Tucson SUV 2012", "Hyundai Veracruz SUV 2012",
    "Hyundai Sonata Hybrid Sedan 2012", "Hyundai Elantra Sedan 2007",
    "Hyundai Accent Sedan 2012", "Hyundai Genesis Sedan 2012", "Hyundai Sonata Sedan 2012",
    "Hyundai Elantra Touring Hatchback 2012", "Hyundai Azera Sedan 2012",
    "Infiniti G Coupe IPL 2012", "Infiniti QX56 SUV 2011", "Isuzu Ascender SUV 2008",
    "Jaguar XK XKR 2012", "Jeep Patriot SUV 2012", "Jeep Wrangler SUV 2012",
    "Jeep Liberty SUV 2012", "Jeep Grand Cherokee SUV 2012", "Jeep Compass SUV 2012",
    "Lamborghini Reventon Coupe 2008", "Lamborghini Aventador Coupe 2012",
    "Lamborghini Gallardo LP 570-4 Superleggera 2012", "Lamborghini Diablo Coupe 2001",
    "Land Rover Range Rover SUV 2012", "Land Rover LR2 SUV 2012",
    "Lincoln Town Car Sedan 2011", "MINI Cooper Roadster Convertible 2012",
    "Maybach Landaulet Convertible 2012", "Mazda Tribute SUV 2011",
    "McLaren MP4-12C Coupe 2012", "Mercedes-Benz 300-Class Convertible 1993",
    "Mercedes-Benz C-Class Sedan 2012", "Mercedes-Benz SL-Class Coupe 2009",
    "Mercedes-Benz E-Class Sedan 2012", "Mercedes-Benz S-Class Sedan 2012",
    "Mercedes-Benz Sprinter Van 2012", "Mitsubishi Lancer Sedan 2012",
    "Nissan Leaf Hatchback 2012", "Nissan NV Passenger Van 2012", "Nissan Juke Hatchback 2012",
    "Nissan 240SX Coupe 1998", "Plymouth Neon Coupe 1999", "Porsche Panamera Sedan 2012",
    "Ram C/V Cargo Van Minivan 2012", "Rolls-Royce Phantom Drophead Coupe Convertible 2012",
    "Rolls-Royce Ghost Sedan 2012", "Rolls-Royce Phantom Sedan 2012",
    "Scion xD Hatchback 2012", "Spyker C8 Convertible 2009", "Spyker C8 Coupe 2009",
    "Suzuki Aerio Sedan 2007", "Suzuki Kizashi Sedan 2012", "Suzuki SX4 Hatchback 2012",
    "Suzuki SX4 Sedan 2012", "Tesla Model S Sedan 2012", "Toyota Sequoia SUV 2012",
    "Toyota Camry Sedan 2012", "Toyota Corolla Sedan 2012", "Toyota 4Runner SUV 2012",
    "Volkswagen Golf Hatchback 2012", "Volkswagen Golf Hatchback 1991",
    "Volkswagen Beetle Hatchback 2012", "Volvo C30 Hatchback 2012", "Volvo 240 Sedan 1993",
    "Volvo XC90 SUV 2007", "smart fortwo Convertible 2012",
)

# CLIP's GTSRB names, spellings included ("horizonal", "bicyle").
GTSRB_CLASSES = (
    "red and white circle 20 kph speed limit",
    "red and white circle 30 kph speed limit",
    "red and white circle 50 kph speed limit",
    "red and white circle 60 kph speed limit",
    "red and white circle 70 kph speed limit",
    "red and white circle 80 kph speed limit",
    "end / de-restriction of 80 kph speed limit",
    "red and white circle 100 kph speed limit",
    "red and white circle 120 kph speed limit",
    "red and white circle red car and black car no passing",
    "red and white circle red truck and black car no passing",
    "red and white triangle road intersection warning",
    "white and yellow diamond priority road",
    "red and white upside down triangle yield right-of-way",
    "stop",
    "empty red and white circle",
    "red and white circle no truck entry",
    "red circle with white horizonal stripe no entry",
    "red and white triangle with exclamation mark warning",
    "red and white triangle with black left curve approaching warning",
    "red and white triangle with black right curve approaching warning",
    "red and white triangle with black double curve approaching warning",
    "red and white triangle rough / bumpy road warning",
    "red and white triangle car skidding / slipping warning",
    "red and white triangle with merging / narrow lanes warning",
    "red and white triangle with person digging / construction / road work warning",
    "red and white triangle with traffic light approaching warning",
    "red and white triangle with person walking warning",
    "red and white triangle with child and person walking warning",
    "red and white triangle with bicyle warning",
    "red and white triangle with snowflake / ice warning",
    "red and white triangle with deer warning",
    "white circle with gray strike bar no speed limit",
    "blue circle with white right turn arrow mandatory",
    "blue circle with white left turn arrow mandatory",
    "blue circle with white forward arrow mandatory",
    "blue circle with white forward or right turn arrow mandatory",
    "blue circle with white forward or left turn arrow mandatory",
    "blue circle with white keep right arrow mandatory",
    "blue circle with white keep left arrow mandatory",
    "blue circle with white arrows indicating a traffic circle",
    "white circle with gray strike bar indicating no passing for cars has ended",
    "white circle with gray strike bar indicating no passing for trucks has ended",
)
GTSRB_FOLDERS = tuple(f"{i:05d}" for i in range(43))

DIGITS = tuple(str(i) for i in range(10))

RESISC45_CLASSES = (
    "airplane", "airport", "baseball diamond", "basketball court", "beach", "bridge", "chaparral",
    "church", "circular farmland", "cloud", "commercial area", "dense residential", "desert",
    "forest", "freeway", "golf course", "ground track field", "harbor", "industrial area",
    "intersection", "island", "lake", "meadow", "medium residential", "mobile home park",
    "mountain", "overpass", "palace", "parking lot", "railway", "railway station",
    "rectangular farmland", "river", "roundabout", "runway", "sea ice", "ship", "snowberg",
    "sparse residential", "stadium", "storage tank", "tennis court", "terrace",
    "thermal power station", "wetland",
)

SUN397_CLASSES = (
    "abbey", "airplane cabin", "airport terminal", "alley", "amphitheater", "amusement arcade",
    "amusement park", "anechoic chamber", "apartment building outdoor", "apse indoor",
    "aquarium", "aqueduct", "arch", "archive", "arrival gate outdoor", "art gallery",
    "art school", "art studio", "assembly line", "athletic field outdoor", "atrium public",
    "attic", "auditorium", "auto factory", "badlands", "badminton court indoor",
    "baggage claim", "bakery shop", "balcony exterior", "balcony interior", "ball pit",
    "ballroom", "bamboo forest", "banquet hall", "bar", "barn", "barndoor", "baseball field",
    "basement", "basilica", "basketball court outdoor", "bathroom", "batters box", "bayou",
    "bazaar indoor", "bazaar outdoor", "beach", "beauty salon", "bedroom", "berth",
    "biology laboratory", "bistro indoor", "boardwalk", "boat deck", "boathouse", "bookstore",
    "booth indoor", "botanical garden", "bow window indoor", "bow window outdoor",
    "bowling alley", "boxing ring", "brewery indoor", "bridge", "building facade", "bullring",
    "burial chamber", "bus interior", "butchers shop", "butte", "cabin outdoor", "cafeteria",
    "campsite", "campus", "canal natural", "canal urban", "candy store", "canyon",
    "car interior backseat", "car interior frontseat", "carrousel", "casino indoor", "castle",
    "catacomb", "cathedral indoor", "cathedral outdoor", "cavern indoor", "cemetery", "chalet",
    "cheese factory", "chemistry lab", "chicken coop indoor", "chicken coop outdoor",
    "childs room", "church indoor", "church outdoor", "classroom", "clean room", "cliff",
    "cloister indoor", "closet", "clothing store", "coast", "cockpit", "coffee shop",
    "computer room", "conference center", "conference room", "construction site",
    "control room", "control tower outdoor", "corn field", "corral", "corridor",
    "cottage garden", "courthouse", "courtroom", "courtyard", "covered bridge exterior", "creek",
    "crevasse", "crosswalk", "cubicle office", "dam", "delicatessen", "dentists office",
    "desert sand", "desert vegetation", "diner indoor", "diner outdoor", "dinette home",
    "dinette vehicle", "dining car", "dining room", "discotheque", "dock", "doorway outdoor",
    "dorm room", "driveway", "driving range outdoor", "drugstore", "electrical substation",
    "elevator door", "elevator interior", "elevator shaft", "engine room", "escalator indoor",
    "excavation", "factory indoor", "fairway", "fastfood restaurant", "field cultivated",
    "field wild", "fire escape", "fire station", "firing range indoor", "fishpond",
    "florist shop indoor", "food court", "forest broadleaf", "forest needleleaf", "forest path",
    "forest road", "formal garden", "fountain", "galley", "game room", "garage indoor",
    "garbage dump", "gas station", "gazebo exterior", "general store indoor",
    "general store outdoor", "gift shop", "golf course", "greenhouse indoor",
    "greenhouse outdoor", "gymnasium indoor", "hangar indoor", "hangar outdoor", "harbor",
    "hayfield", "heliport", "herb garden", "highway", "hill", "home office", "hospital",
    "hospital room", "hot spring", "hot tub outdoor", "hotel outdoor", "hotel room", "house",
    "hunting lodge outdoor", "ice cream parlor", "ice floe", "ice shelf",
    "ice skating rink indoor", "ice skating rink outdoor", "iceberg", "igloo",
    "industrial area", "inn outdoor", "islet", "jacuzzi indoor", "jail cell", "jail indoor",
    "jewelry shop", "kasbah", "kennel indoor", "kennel outdoor", "kindergarden classroom",
    "kitchen", "kitchenette", "labyrinth outdoor", "lake natural", "landfill", "landing deck",
    "laundromat", "lecture room", "library indoor", "library outdoor", "lido deck outdoor",
    "lift bridge", "lighthouse", "limousine interior", "living room", "lobby", "lock chamber",
    "locker room", "mansion", "manufactured home", "market indoor", "market outdoor", "marsh",
    "martial arts gym", "mausoleum", "medina", "moat water", "monastery outdoor",
    "mosque indoor", "mosque outdoor", "motel", "mountain", "mountain snowy",
    "movie theater indoor", "museum indoor", "music store", "music studio",
    "nuclear power plant outdoor", "nursery", "oast house", "observatory outdoor", "ocean",
    "office", "office building", "oil refinery outdoor", "oilrig", "operating room", "orchard",
    "outhouse outdoor", "pagoda", "palace", "pantry", "park", "parking garage indoor",
    "parking garage outdoor", "parking lot", "parlor", "pasture", "patio", "pavilion",
    "pharmacy", "phone booth", "physics laboratory", "picnic area", "pilothouse indoor",
    "planetarium outdoor", "playground", "playroom", "plaza", "podium indoor", "podium outdoor",
    "pond", "poolroom establishment", "poolroom home", "power plant outdoor", "promenade deck",
    "pub indoor", "pulpit", "putting green", "racecourse", "raceway", "raft", "railroad track",
    "rainforest", "reception", "recreation room", "residential neighborhood", "restaurant",
    "restaurant kitchen", "restaurant patio", "rice paddy", "riding arena", "river",
    "rock arch", "rope bridge", "ruin", "runway", "sandbar", "sandbox", "sauna", "schoolhouse",
    "sea cliff", "server room", "shed", "shoe shop", "shopfront", "shopping mall indoor",
    "shower", "skatepark", "ski lodge", "ski resort", "ski slope", "sky", "skyscraper", "slum",
    "snowfield", "squash court", "stable", "stadium baseball", "stadium football",
    "stage indoor", "staircase", "street", "subway interior", "subway station platform",
    "supermarket", "sushi bar", "swamp", "swimming pool indoor", "swimming pool outdoor",
    "synagogue indoor", "synagogue outdoor", "television studio", "temple east asia",
    "temple south asia", "tennis court indoor", "tennis court outdoor", "tent outdoor",
    "theater indoor procenium", "theater indoor seats", "thriftshop", "throne room",
    "ticket booth", "toll plaza", "topiary garden", "tower", "toyshop", "track outdoor",
    "train railway", "train station platform", "tree farm", "tree house", "trench",
    "underwater coral reef", "utility room", "valley", "van interior", "vegetable garden",
    "veranda", "veterinarians office", "viaduct", "videostore", "village", "vineyard",
    "volcano", "volleyball court indoor", "volleyball court outdoor", "waiting room",
    "warehouse indoor", "water tower", "waterfall block", "waterfall fan", "waterfall plunge",
    "watering hole", "wave", "wet bar", "wheat field", "wind farm", "windmill",
    "wine cellar barrel storage", "wine cellar bottle storage", "wrestling ring indoor", "yard",
    "youth hostel",
)

CIFAR100_CLASSES = (
    "apple", "aquarium fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
    "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple tree", "motorcycle", "mountain", "mouse", "mushroom",
    "oak tree", "orange", "orchid", "otter", "palm tree", "pear", "pickup truck", "pine tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake",
    "spider", "squirrel", "streetcar", "sunflower", "sweet pepper", "table", "tank", "telephone",
    "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
    "willow tree", "wolf", "woman", "worm",
)

# CLIP's curated ImageNet names, in the standard label order (sorted WordNet ids). CLIP's list
# repeats two names ("missile" at 657 and 744, "sunglasses" at 836 and 837); here the second of
# each is "projectile" and the first "sunglass" (the WordNet lemmas), so names stay unique.
IMAGENET_CLASSES = (
    "tench", "goldfish", "great white shark", "tiger shark", "hammerhead shark", "electric ray",
    "stingray", "rooster", "hen", "ostrich", "brambling", "goldfinch", "house finch", "junco",
    "indigo bunting", "American robin", "bulbul", "jay", "magpie", "chickadee",
    "American dipper", "kite (bird of prey)", "bald eagle", "vulture", "great grey owl",
    "fire salamander", "smooth newt", "newt", "spotted salamander", "axolotl",
    "American bullfrog", "tree frog", "tailed frog", "loggerhead sea turtle",
    "leatherback sea turtle", "mud turtle", "terrapin", "box turtle", "banded gecko",
    "green iguana", "Carolina anole", "desert grassland whiptail lizard", "agama",
    "frilled-necked lizard", "alligator lizard", "Gila monster", "European green lizard",
    "chameleon", "Komodo dragon", "Nile crocodile", "American alligator", "triceratops",
    "worm snake", "ring-necked snake", "eastern hog-nosed snake", "smooth green snake",
    "kingsnake", "garter snake", "water snake", "vine snake", "night snake", "boa constrictor",
    "African rock python", "Indian cobra", "green mamba", "sea snake", "Saharan horned viper",
    "eastern diamondback rattlesnake", "sidewinder rattlesnake", "trilobite", "harvestman",
    "scorpion", "yellow garden spider", "barn spider", "European garden spider",
    "southern black widow", "tarantula", "wolf spider", "tick", "centipede", "black grouse",
    "ptarmigan", "ruffed grouse", "prairie grouse", "peafowl", "quail", "partridge",
    "african grey parrot", "macaw", "sulphur-crested cockatoo", "lorikeet", "coucal",
    "bee eater", "hornbill", "hummingbird", "jacamar", "toucan", "duck",
    "red-breasted merganser", "goose", "black swan", "tusker", "echidna", "platypus", "wallaby",
    "koala", "wombat", "jellyfish", "sea anemone", "brain coral", "flatworm", "nematode",
    "conch", "snail", "slug", "sea slug", "chiton", "chambered nautilus", "Dungeness crab",
    "rock crab", "fiddler crab", "red king crab", "American lobster", "spiny lobster",
    "crayfish", "hermit crab", "isopod", "white stork", "black stork", "spoonbill", "flamingo",
    "little blue heron", "great egret", "bittern bird", "crane bird", "limpkin",
    "common gallinule", "American coot", "bustard", "ruddy turnstone", "dunlin",
    "common redshank", "dowitcher", "oystercatcher", "pelican", "king penguin", "albatross",
    "grey whale", "killer whale", "dugong", "sea lion", "Chihuahua", "Japanese Chin", "Maltese",
    "Pekingese", "Shih Tzu", "King Charles Spaniel", "Papillon", "toy terrier",
    "Rhodesian Ridgeback", "Afghan Hound", "Basset Hound", "Beagle", "Bloodhound",
    "Bluetick Coonhound", "Black and Tan Coonhound", "Treeing Walker Coonhound",
    "English foxhound", "Redbone Coonhound", "borzoi", "Irish Wolfhound", "Italian Greyhound",
    "Whippet", "Ibizan Hound", "Norwegian Elkhound", "Otterhound", "Saluki",
    "Scottish Deerhound", "Weimaraner", "Staffordshire Bull Terrier",
    "American Staffordshire Terrier", "Bedlington Terrier", "Border Terrier",
    "Kerry Blue Terrier", "Irish Terrier", "Norfolk Terrier", "Norwich Terrier",
    "Yorkshire Terrier", "Wire Fox Terrier", "Lakeland Terrier", "Sealyham Terrier",
    "Airedale Terrier", "Cairn Terrier", "Australian Terrier", "Dandie Dinmont Terrier",
    "Boston Terrier", "Miniature Schnauzer", "Giant Schnauzer", "Standard Schnauzer",
    "Scottish Terrier", "Tibetan Terrier", "Australian Silky Terrier",
    "Soft-coated Wheaten Terrier", "West Highland White Terrier", "Lhasa Apso",
    "Flat-Coated Retriever", "Curly-coated Retriever", "Golden Retriever",
    "Labrador Retriever", "Chesapeake Bay Retriever", "German Shorthaired Pointer", "Vizsla",
    "English Setter", "Irish Setter", "Gordon Setter", "Brittany dog", "Clumber Spaniel",
    "English Springer Spaniel", "Welsh Springer Spaniel", "Cocker Spaniel", "Sussex Spaniel",
    "Irish Water Spaniel", "Kuvasz", "Schipperke", "Groenendael dog", "Malinois", "Briard",
    "Australian Kelpie", "Komondor", "Old English Sheepdog", "Shetland Sheepdog", "collie",
    "Border Collie", "Bouvier des Flandres dog", "Rottweiler", "German Shepherd Dog",
    "Dobermann", "Miniature Pinscher", "Greater Swiss Mountain Dog", "Bernese Mountain Dog",
    "Appenzeller Sennenhund", "Entlebucher Sennenhund", "Boxer", "Bullmastiff",
    "Tibetan Mastiff", "French Bulldog", "Great Dane", "St. Bernard", "husky",
    "Alaskan Malamute", "Siberian Husky", "Dalmatian", "Affenpinscher", "Basenji", "pug",
    "Leonberger", "Newfoundland dog", "Great Pyrenees dog", "Samoyed", "Pomeranian",
    "Chow Chow", "Keeshond", "brussels griffon", "Pembroke Welsh Corgi", "Cardigan Welsh Corgi",
    "Toy Poodle", "Miniature Poodle", "Standard Poodle",
    "Mexican hairless dog (xoloitzcuintli)", "grey wolf", "Alaskan tundra wolf",
    "red wolf or maned wolf", "coyote", "dingo", "dhole", "African wild dog", "hyena",
    "red fox", "kit fox", "Arctic fox", "grey fox", "tabby cat", "tiger cat", "Persian cat",
    "Siamese cat", "Egyptian Mau", "cougar", "lynx", "leopard", "snow leopard", "jaguar",
    "lion", "tiger", "cheetah", "brown bear", "American black bear", "polar bear",
    "sloth bear", "mongoose", "meerkat", "tiger beetle", "ladybug", "ground beetle",
    "longhorn beetle", "leaf beetle", "dung beetle", "rhinoceros beetle", "weevil", "fly",
    "bee", "ant", "grasshopper", "cricket insect", "stick insect", "cockroach",
    "praying mantis", "cicada", "leafhopper", "lacewing", "dragonfly", "damselfly",
    "red admiral butterfly", "ringlet butterfly", "monarch butterfly", "small white butterfly",
    "sulphur butterfly", "gossamer-winged butterfly", "starfish", "sea urchin", "sea cucumber",
    "cottontail rabbit", "hare", "Angora rabbit", "hamster", "porcupine", "fox squirrel",
    "marmot", "beaver", "guinea pig", "common sorrel horse", "zebra", "pig", "wild boar",
    "warthog", "hippopotamus", "ox", "water buffalo", "bison", "ram (adult male sheep)",
    "bighorn sheep", "Alpine ibex", "hartebeest", "impala (antelope)", "gazelle",
    "arabian camel", "llama", "weasel", "mink", "European polecat", "black-footed ferret",
    "otter", "skunk", "badger", "armadillo", "three-toed sloth", "orangutan", "gorilla",
    "chimpanzee", "gibbon", "siamang", "guenon", "patas monkey", "baboon", "macaque", "langur",
    "black-and-white colobus", "proboscis monkey", "marmoset", "white-headed capuchin",
    "howler monkey", "titi monkey", "Geoffroy's spider monkey", "common squirrel monkey",
    "ring-tailed lemur", "indri", "Asian elephant", "African bush elephant", "red panda",
    "giant panda", "snoek fish", "eel", "silver salmon", "rock beauty fish", "clownfish",
    "sturgeon", "gar fish", "lionfish", "pufferfish", "abacus", "abaya", "academic gown",
    "accordion", "acoustic guitar", "aircraft carrier", "airliner", "airship", "altar",
    "ambulance", "amphibious vehicle", "analog clock", "apiary", "apron", "trash can",
    "assault rifle", "backpack", "bakery", "balance beam", "balloon", "ballpoint pen",
    "Band-Aid", "banjo", "baluster / handrail", "barbell", "barber chair", "barbershop", "barn",
    "barometer", "barrel", "wheelbarrow", "baseball", "basketball", "bassinet", "bassoon",
    "swimming cap", "bath towel", "bathtub", "station wagon", "lighthouse", "beaker",
    "military hat (bearskin or shako)", "beer bottle", "beer glass", "bell tower", "baby bib",
    "tandem bicycle", "bikini", "ring binder", "binoculars", "birdhouse", "boathouse",
    "bobsleigh", "bolo tie", "poke bonnet", "bookcase", "bookstore", "bottle cap",
    "hunting bow", "bow tie", "brass memorial plaque", "bra", "breakwater", "breastplate",
    "broom", "bucket", "buckle", "bulletproof vest", "high-speed train", "butcher shop",
    "taxicab", "cauldron", "candle", "cannon", "canoe", "can opener", "cardigan", "car mirror",
    "carousel", "tool kit", "cardboard box / carton", "car wheel", "automated teller machine",
    "cassette", "cassette player", "castle", "catamaran", "CD player", "cello", "mobile phone",
    "chain", "chain-link fence", "chain mail", "chainsaw", "storage chest", "chiffonier",
    "bell or wind chime", "china cabinet", "Christmas stocking", "church", "movie theater",
    "cleaver", "cliff dwelling", "cloak", "clogs", "cocktail shaker", "coffee mug",
    "coffeemaker", "spiral or coil", "combination lock", "computer keyboard", "candy store",
    "container ship", "convertible", "corkscrew", "cornet", "cowboy boot", "cowboy hat",
    "cradle", "construction crane", "crash helmet", "crate", "infant bed", "Crock Pot",
    "croquet ball", "crutch", "cuirass", "dam", "desk", "desktop computer",
    "rotary dial telephone", "diaper", "digital clock", "digital watch", "dining table",
    "dishcloth", "dishwasher", "disc brake", "dock", "dog sled", "dome", "doormat",
    "drilling rig", "drum", "drumstick", "dumbbell", "Dutch oven", "electric fan",
    "electric guitar", "electric locomotive", "entertainment center", "envelope",
    "espresso machine", "face powder", "feather boa", "filing cabinet", "fireboat",
    "fire truck", "fire screen", "flagpole", "flute", "folding chair", "football helmet",
    "forklift", "fountain", "fountain pen", "four-poster bed", "freight car", "French horn",
    "frying pan", "fur coat", "garbage truck", "gas mask or respirator", "gas pump", "goblet",
    "go-kart", "golf ball", "golf cart", "gondola", "gong", "gown", "grand piano",
    "greenhouse", "radiator grille", "grocery store", "guillotine", "hair clip", "hair spray",
    "half-track", "hammer", "hamper", "hair dryer", "hand-held computer", "handkerchief",
    "hard disk drive", "harmonica", "harp", "combine harvester", "hatchet", "holster",
    "home theater", "honeycomb", "hook", "hoop skirt", "gymnastic horizontal bar",
    "horse-drawn vehicle", "hourglass", "iPod", "clothes iron", "carved pumpkin", "jeans",
    "jeep", "T-shirt", "jigsaw puzzle", "rickshaw", "joystick", "kimono", "knee pad", "knot",
    "lab coat", "ladle", "lampshade", "laptop computer", "lawn mower", "lens cap",
    "letter opener", "library", "lifeboat", "lighter", "limousine", "ocean liner", "lipstick",
    "slip-on shoe", "lotion", "music speaker", "loupe magnifying glass", "sawmill",
    "magnetic compass", "messenger bag", "mailbox", "tights", "one-piece bathing suit",
    "manhole cover", "maraca", "marimba", "mask", "matchstick", "maypole", "maze",
    "measuring cup", "medicine cabinet", "megalith", "microphone", "microwave oven",
    "military uniform", "milk can", "minibus", "miniskirt", "minivan", "missile", "mitten",
    "mixing bowl", "mobile home", "ford model t", "modem", "monastery", "monitor", "moped",
    "mortar and pestle", "graduation cap", "mosque", "mosquito net", "vespa",
    "mountain bike", "tent", "computer mouse", "mousetrap", "moving van", "muzzle",
    "metal nail", "neck brace", "necklace", "baby pacifier", "notebook computer", "obelisk",
    "oboe", "ocarina", "odometer", "oil filter", "pipe organ", "oscilloscope", "overskirt",
    "bullock cart", "oxygen mask", "product packet / packaging", "paddle", "paddle wheel",
    "padlock", "paintbrush", "pajamas", "palace", "pan flute", "paper towel", "parachute",
    "parallel bars", "park bench", "parking meter", "railroad car", "patio", "payphone",
    "pedestal", "pencil case", "pencil sharpener", "perfume", "Petri dish", "photocopier",
    "plectrum", "Pickelhaube", "picket fence", "pickup truck", "pier", "piggy bank",
    "pill bottle", "pillow", "ping-pong ball", "pinwheel", "pirate ship", "drink pitcher",
    "block plane", "planetarium", "plastic bag", "plate rack", "farm plow", "plunger",
    "Polaroid camera", "pole", "police van", "poncho", "pool table", "soda bottle",
    "plant pot", "potter's wheel", "power drill", "prayer rug", "printer", "prison",
    "projectile", "projector", "hockey puck", "punching bag", "purse", "quill", "quilt",
    "race car", "racket", "radiator", "radio", "radio telescope", "rain barrel",
    "recreational vehicle", "fishing casting reel", "reflex camera", "refrigerator",
    "remote control", "restaurant", "revolver", "rifle", "rocking chair", "rotisserie",
    "eraser", "rugby ball", "ruler measuring stick", "sneaker", "safe", "safety pin",
    "salt shaker", "sandal", "sarong", "saxophone", "scabbard", "weighing scale",
    "school bus", "schooner", "scoreboard", "CRT monitor", "screw", "screwdriver",
    "seat belt", "sewing machine", "shield", "shoe store", "shoji screen / room divider",
    "shopping basket", "shopping cart", "shovel", "shower cap", "shower curtain", "ski",
    "balaclava ski mask", "sleeping bag", "slide rule", "sliding door", "slot machine",
    "snorkel", "snowmobile", "snowplow", "soap dispenser", "soccer ball", "sock",
    "solar thermal collector", "sombrero", "soup bowl", "keyboard space bar", "space heater",
    "space shuttle", "spatula", "motorboat", "spider web", "spindle", "sports car",
    "spotlight", "stage", "steam locomotive", "through arch bridge", "steel drum",
    "stethoscope", "scarf", "stone wall", "stopwatch", "stove", "strainer", "tram",
    "stretcher", "couch", "stupa", "submarine", "suit", "sundial", "sunglass", "sunglasses",
    "sunscreen", "suspension bridge", "mop", "sweatshirt", "swim trunks / shorts", "swing",
    "electrical switch", "syringe", "table lamp", "tank", "tape player", "teapot",
    "teddy bear", "television", "tennis ball", "thatched roof", "front curtain", "thimble",
    "threshing machine", "throne", "tile roof", "toaster", "tobacco shop", "toilet seat",
    "torch", "totem pole", "tow truck", "toy store", "tractor", "semi-trailer truck", "tray",
    "trench coat", "tricycle", "trimaran", "tripod", "triumphal arch", "trolleybus",
    "trombone", "hot tub", "turnstile", "typewriter keyboard", "umbrella", "unicycle",
    "upright piano", "vacuum cleaner", "vase", "vaulted or arched ceiling", "velvet fabric",
    "vending machine", "vestment", "viaduct", "violin", "volleyball", "waffle iron",
    "wall clock", "wallet", "wardrobe", "military aircraft", "sink", "washing machine",
    "water bottle", "water jug", "water tower", "whiskey jug", "whistle", "hair wig",
    "window screen", "window shade", "Windsor tie", "wine bottle", "airplane wing", "wok",
    "wooden spoon", "wool", "split-rail fence", "shipwreck", "sailboat", "yurt", "website",
    "comic book", "crossword", "traffic or street sign", "traffic light", "dust jacket", "menu",
    "plate", "guacamole", "consomme", "hot pot", "trifle", "ice cream", "popsicle", "baguette",
    "bagel", "pretzel", "cheeseburger", "hot dog", "mashed potatoes", "cabbage", "broccoli",
    "cauliflower", "zucchini", "spaghetti squash", "acorn squash", "butternut squash",
    "cucumber", "artichoke", "bell pepper", "cardoon", "mushroom", "Granny Smith apple",
    "strawberry", "orange", "lemon", "fig", "pineapple", "banana", "jackfruit",
    "cherimoya (custard apple)", "pomegranate", "hay", "carbonara", "chocolate syrup", "dough",
    "meatloaf", "pizza", "pot pie", "burrito", "red wine", "espresso", "tea cup", "eggnog",
    "mountain", "bubble", "cliff", "coral reef", "geyser", "lakeshore", "promontory",
    "sandbar", "beach", "valley", "volcano", "baseball player", "bridegroom", "scuba diver",
    "rapeseed", "daisy", "yellow lady's slipper", "corn", "acorn", "rose hip",
    "horse chestnut seed", "coral fungus", "agaric", "gyromitra", "stinkhorn mushroom",
    "earth star fungus", "hen of the woods mushroom", "bolete", "corn cob", "toilet paper",
)

UCMERCED_CLASSES = (
    "agricultural", "airplane", "baseball diamond", "beach", "buildings", "chaparral",
    "dense residential", "forest", "freeway", "golf course", "harbor", "intersection",
    "medium residential", "mobile home park", "overpass", "parking lot", "river", "runway",
    "sparse residential", "storage tanks", "tennis court",
)

AID_CLASSES = (
    "airport", "bare land", "baseball field", "beach", "bridge", "center", "church",
    "commercial", "dense residential", "desert", "farmland", "forest", "industrial", "meadow",
    "medium residential", "mountain", "park", "parking", "playground", "pond", "port",
    "railway station", "resort", "river", "school", "sparse residential", "square", "stadium",
    "storage tanks", "viaduct",
)

ESC50_CLASSES = (
    "dog", "rooster", "pig", "cow", "frog", "cat", "hen", "insects", "sheep", "crow", "rain",
    "sea waves", "crackling fire", "crickets", "chirping birds", "water drops", "wind",
    "pouring water", "toilet flush", "thunderstorm", "crying baby", "sneezing", "clapping",
    "breathing", "coughing", "footsteps", "laughing", "brushing teeth", "snoring",
    "drinking sipping", "door wood knock", "mouse click", "keyboard typing", "door wood creaks",
    "can opening", "washing machine", "vacuum cleaner", "clock alarm", "clock tick",
    "glass breaking", "helicopter", "chainsaw", "siren", "car horn", "engine", "train",
    "church bells", "airplane", "fireworks", "hand saw",
)

GTZAN_CLASSES = (
    "blues", "classical", "country", "disco", "hip hop", "jazz", "metal", "pop", "reggae", "rock",
)

URBANSOUND8K_CLASSES = (
    "air conditioner", "car horn", "children playing", "dog bark", "drilling", "engine idling",
    "gun shot", "jackhammer", "siren", "street music",
)

# DomainNet's 345 classes (shared by its six domains): the folder names of the release, in the
# label order of its split lists (alphabetical ignoring case), and the prompt names derived from
# them (underscores as spaces).
DOMAINNET_FOLDERS = (
    "aircraft_carrier", "airplane", "alarm_clock", "ambulance", "angel", "animal_migration",
    "ant", "anvil", "apple", "arm", "asparagus", "axe", "backpack", "banana", "bandage", "barn",
    "baseball", "baseball_bat", "basket", "basketball", "bat", "bathtub", "beach", "bear",
    "beard", "bed", "bee", "belt", "bench", "bicycle", "binoculars", "bird", "birthday_cake",
    "blackberry", "blueberry", "book", "boomerang", "bottlecap", "bowtie", "bracelet", "brain",
    "bread", "bridge", "broccoli", "broom", "bucket", "bulldozer", "bus", "bush", "butterfly",
    "cactus", "cake", "calculator", "calendar", "camel", "camera", "camouflage", "campfire",
    "candle", "cannon", "canoe", "car", "carrot", "castle", "cat", "ceiling_fan", "cell_phone",
    "cello", "chair", "chandelier", "church", "circle", "clarinet", "clock", "cloud",
    "coffee_cup", "compass", "computer", "cookie", "cooler", "couch", "cow", "crab", "crayon",
    "crocodile", "crown", "cruise_ship", "cup", "diamond", "dishwasher", "diving_board", "dog",
    "dolphin", "donut", "door", "dragon", "dresser", "drill", "drums", "duck", "dumbbell", "ear",
    "elbow", "elephant", "envelope", "eraser", "eye", "eyeglasses", "face", "fan", "feather",
    "fence", "finger", "fire_hydrant", "fireplace", "firetruck", "fish", "flamingo",
    "flashlight", "flip_flops", "floor_lamp", "flower", "flying_saucer", "foot", "fork", "frog",
    "frying_pan", "garden", "garden_hose", "giraffe", "goatee", "golf_club", "grapes", "grass",
    "guitar", "hamburger", "hammer", "hand", "harp", "hat", "headphones", "hedgehog",
    "helicopter", "helmet", "hexagon", "hockey_puck", "hockey_stick", "horse", "hospital",
    "hot_air_balloon", "hot_dog", "hot_tub", "hourglass", "house", "house_plant", "hurricane",
    "ice_cream", "jacket", "jail", "kangaroo", "key", "keyboard", "knee", "knife", "ladder",
    "lantern", "laptop", "leaf", "leg", "light_bulb", "lighter", "lighthouse", "lightning",
    "line", "lion", "lipstick", "lobster", "lollipop", "mailbox", "map", "marker", "matches",
    "megaphone", "mermaid", "microphone", "microwave", "monkey", "moon", "mosquito", "motorbike",
    "mountain", "mouse", "moustache", "mouth", "mug", "mushroom", "nail", "necklace", "nose",
    "ocean", "octagon", "octopus", "onion", "oven", "owl", "paint_can", "paintbrush",
    "palm_tree", "panda", "pants", "paper_clip", "parachute", "parrot", "passport", "peanut",
    "pear", "peas", "pencil", "penguin", "piano", "pickup_truck", "picture_frame", "pig",
    "pillow", "pineapple", "pizza", "pliers", "police_car", "pond", "pool", "popsicle",
    "postcard", "potato", "power_outlet", "purse", "rabbit", "raccoon", "radio", "rain",
    "rainbow", "rake", "remote_control", "rhinoceros", "rifle", "river", "roller_coaster",
    "rollerskates", "sailboat", "sandwich", "saw", "saxophone", "school_bus", "scissors",
    "scorpion", "screwdriver", "sea_turtle", "see_saw", "shark", "sheep", "shoe", "shorts",
    "shovel", "sink", "skateboard", "skull", "skyscraper", "sleeping_bag", "smiley_face",
    "snail", "snake", "snorkel", "snowflake", "snowman", "soccer_ball", "sock", "speedboat",
    "spider", "spoon", "spreadsheet", "square", "squiggle", "squirrel", "stairs", "star",
    "steak", "stereo", "stethoscope", "stitches", "stop_sign", "stove", "strawberry",
    "streetlight", "string_bean", "submarine", "suitcase", "sun", "swan", "sweater",
    "swing_set", "sword", "syringe", "t-shirt", "table", "teapot", "teddy-bear", "telephone",
    "television", "tennis_racquet", "tent", "The_Eiffel_Tower", "The_Great_Wall_of_China",
    "The_Mona_Lisa", "tiger", "toaster", "toe", "toilet", "tooth", "toothbrush", "toothpaste",
    "tornado", "tractor", "traffic_light", "train", "tree", "triangle", "trombone", "truck",
    "trumpet", "umbrella", "underwear", "van", "vase", "violin", "washing_machine",
    "watermelon", "waterslide", "whale", "wheel", "windmill", "wine_bottle", "wine_glass",
    "wristwatch", "yoga", "zebra", "zigzag",
)
DOMAINNET_CLASSES = tuple(f.replace("_", " ") for f in DOMAINNET_FOLDERS)
DOMAINNET_DOMAINS = ("real", "sketch", "clipart", "painting", "quickdraw", "infograph")


# ---- specs -----------------------------------------------------------------------------------

def folder_key(name: str) -> str:
  """How an on-disk class name is compared with a class: lower case, alphanumerics only, and an
  all-digit name read as an integer ("Sea_Lake" -> "sealake", "00007" -> "7")."""
  key = re.sub(r"[^0-9a-z]", "", str(name).lower())
  return str(int(key)) if key.isdigit() else key


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A classification task.

  classnames (C,) in label order; templates each with exactly one "{}"; splits maps a role
  ("train", "test") to the split's on-disk name; folder_names (C,), when given, are the on-disk
  class names (folders, dataset label names) where they differ from the class names;
  index_by_sorted_folders: on-disk names are opaque ids whose sorted order is the label order
  (ImageNet's WordNet ids); build_section: the docs/datasets.md section that says how to
  prepare it.
  """
  name: str
  classnames: tuple[str, ...]
  templates: tuple[str, ...]
  splits: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(DEFAULT_SPLITS))
  modality: str = IMAGE
  folder_names: tuple[str, ...] | None = None
  aliases: tuple[str, ...] = ()
  index_by_sorted_folders: bool = False
  build_section: str = ""
  control: bool = False

  def __post_init__(self):
    if self.modality not in (IMAGE, AUDIO):
      raise ValueError(f"task {self.name!r}: modality must be {IMAGE!r} or {AUDIO!r}, got "
                       f"{self.modality!r}")
    if len(set(self.classnames)) != len(self.classnames):
      raise ValueError(f"task {self.name!r}: duplicate class names")
    if self.folder_names is not None and len(self.folder_names) != len(self.classnames):
      raise ValueError(f"task {self.name!r}: {len(self.folder_names)} folder names for "
                       f"{len(self.classnames)} classes")
    check_templates(self.templates, f"task {self.name!r}")
    if "train" not in self.splits or "test" not in self.splits:
      raise ValueError(f"task {self.name!r}: splits need 'train' and 'test' roles, got "
                       f"{dict(self.splits)}")

  @property
  def num_classes(self) -> int:
    return len(self.classnames)

  def split_name(self, split: str) -> str:
    """A role ("train", "test") -> its on-disk split name; any other name passes through."""
    return self.splits.get(split, split)

  def prompts(self, classname: str) -> list[str]:
    """The class's prompts, one per template."""
    return [t.format(classname) for t in self.templates]

  def class_index(self) -> dict[str, int]:
    """folder_key of every accepted on-disk name (class names and folder names) -> label."""
    index: dict[str, int] = {}
    names = [self.classnames] + ([self.folder_names] if self.folder_names else [])
    for names_ in names:
      for i, n in enumerate(names_):
        k = folder_key(n)
        if index.get(k, i) != i:
          raise ValueError(f"task {self.name!r}: on-disk name {n!r} is ambiguous "
                           f"(classes {index[k]} and {i})")
        index[k] = i
    return index


def _spec(name, classnames, templates, *, build_section, **kw) -> TaskSpec:
  return TaskSpec(name=name, classnames=tuple(classnames), templates=tuple(templates),
                  build_section=build_section, **kw)


_SPECS = (
    _spec("eurosat", EUROSAT_CLASSES, EUROSAT_TEMPLATES, folder_names=EUROSAT_FOLDERS,
          build_section="EuroSAT", aliases=("euro-sat", "eurosat_rgb")),
    _spec("dtd", DTD_CLASSES, DTD_TEMPLATES, build_section="DTD",
          aliases=("describable textures",)),
    _spec("cars", CARS_CLASSES, CARS_TEMPLATES, build_section="Stanford Cars",
          aliases=("stanford cars", "stanford_cars", "stanfordcars")),
    _spec("gtsrb", GTSRB_CLASSES, GTSRB_TEMPLATES, folder_names=GTSRB_FOLDERS,
          build_section="GTSRB"),
    _spec("mnist", DIGITS, MNIST_TEMPLATES, build_section="MNIST"),
    _spec("resisc45", RESISC45_CLASSES, REMOTE_SENSING_TEMPLATES, build_section="RESISC45",
          aliases=("nwpu-resisc45",)),
    _spec("svhn", DIGITS, MNIST_TEMPLATES, build_section="SVHN"),
    _spec("sun397", SUN397_CLASSES, SUN397_TEMPLATES, build_section="SUN397"),
    _spec("cifar100", CIFAR100_CLASSES, CIFAR_TEMPLATES, build_section="CIFAR-100",
          control=True),
    _spec("imagenet", IMAGENET_CLASSES, IMAGENET_TEMPLATES, build_section="ImageNet",
          splits={"train": "train", "test": "val"}, index_by_sorted_folders=True,
          aliases=("imagenet-1k", "imagenet1k", "ilsvrc2012"), control=True),
    _spec("ucmerced", UCMERCED_CLASSES, REMOTE_SENSING_TEMPLATES, build_section="UCMerced",
          aliases=("uc merced", "ucmerced_landuse", "uc merced land use")),
    _spec("aid", AID_CLASSES, REMOTE_SENSING_TEMPLATES, build_section="AID"),
    _spec("esc50", ESC50_CLASSES, SOUND_TEMPLATES, modality=AUDIO, build_section="ESC-50"),
    _spec("gtzan", GTZAN_CLASSES, MUSIC_TEMPLATES, modality=AUDIO, build_section="GTZAN"),
    _spec("urbansound8k", URBANSOUND8K_CLASSES, SOUND_TEMPLATES, modality=AUDIO,
          build_section="UrbanSound8K", aliases=("us8k", "urbansound")),
) + tuple(
    _spec(f"domainnet_{d}", DOMAINNET_CLASSES, DOMAINNET_TEMPLATES[d], build_section="DomainNet",
          folder_names=DOMAINNET_FOLDERS,
          aliases=(f"DomainNet-{d}", f"DomainNet {d}", f"dn_{d}")
          + (("DomainNet-Paint",) if d == "painting" else ()))
    for d in DOMAINNET_DOMAINS
)

TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS)
IMAGE_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.modality == IMAGE)
AUDIO_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.modality == AUDIO)
CONTROL_TASKS: tuple[str, ...] = tuple(s.name for s in _SPECS if s.control)
_BY_KEY = {folder_key(k): s for s in _SPECS for k in (s.name,) + s.aliases}


def get_task(name: str | TaskSpec) -> TaskSpec:
  """The spec of a task by name or alias, any case and punctuation ("CIFAR-100", "cifar100").

  A TaskSpec passes through. Raises ValueError listing the known tasks for an unknown name.
  """
  if isinstance(name, TaskSpec):
    return name
  spec = _BY_KEY.get(folder_key(name))
  if spec is None:
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
  return spec


# ---- probes and subsets ------------------------------------------------------------------------

def probe_indices(n_train: int, n_probes: int, seed: int) -> np.ndarray:
  """The probe rule: n_probes distinct positions in [0, n_train), drawn by
  ``numpy.random.default_rng(seed)`` without replacement, sorted. Returns (n_probes,) int64.

  Raises ValueError when n_probes > n_train or either is negative.
  """
  n_train, n_probes = int(n_train), int(n_probes)
  if n_train < 0 or n_probes < 0:
    raise ValueError(f"n_train and n_probes must be non-negative, got {n_train}, {n_probes}")
  if n_probes > n_train:
    raise ValueError(f"asked for {n_probes} probes from a train split of {n_train} examples")
  rng = np.random.default_rng(seed)
  return np.sort(rng.choice(n_train, size=n_probes, replace=False)).astype(np.int64)


def balanced_subset(labels: Sequence[int] | np.ndarray, per_class: int, seed: int, *,
                    num_classes: int | None = None, strict: bool = True) -> np.ndarray:
  """A class-balanced subset (ImageNet's option): per_class positions of every class, drawn
  without replacement by ``numpy.random.default_rng(seed)``, returned sorted.

  labels (N,) int; num_classes defaults to max(labels) + 1. Returns (num_classes * per_class,)
  int64. A class with fewer than per_class examples raises ValueError naming it, unless
  strict=False, in which case all of its examples are taken.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be 1-D, got shape {labels.shape}")
  if per_class < 0:
    raise ValueError(f"per_class must be non-negative, got {per_class}")
  num_classes = int(labels.max()) + 1 if num_classes is None and labels.size else (
      num_classes or 0)
  rng = np.random.default_rng(seed)
  picked = []
  for c in range(num_classes):
    where = np.flatnonzero(labels == c)
    if where.size < per_class and strict:
      raise ValueError(f"class {c} has {where.size} examples, fewer than per_class={per_class} "
                       "(pass strict=False to take all of them)")
    k = min(per_class, where.size)
    picked.append(rng.choice(where, size=k, replace=False))
  out = np.concatenate(picked) if picked else np.zeros((0,), np.int64)
  return np.sort(out).astype(np.int64)
